"""convert stage, flow level: the Prefect flow on a real server, local process pool vs a real Dask LocalCluster."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.convert.distribute import run_local
from tests.helpers.datasets import flat_dataset, make_job, shard_bytes
from tests.helpers.images import jpeg, noisy_jpeg
from tests.helpers.params import section, write_params
from tests.helpers.project import REPO


def _project(root: Path, **convert) -> Path:
    """A dataset under `root` and a params.yaml there (paths relative to it, as in the repo)."""
    flat_dataset(root, [("n0%d" % (i % 3), f"img{i:03d}.JPEG", noisy_jpeg(i)) for i in range(24)]
                 + [("n01", "cmyk.JPEG", jpeg(mode="CMYK")), ("n02", "zero.JPEG", b"")])
    return write_params(root, convert={"shard_mb": 0.03, "row_group_rows": 5, "max_bad_fraction": 0.1, **convert})


def test_flow_local_runner_and_dask_cluster_write_the_same_bytes(prefect_api, tmp_path, monkeypatch):
    from distributed import LocalCluster

    from flows.convert import run
    from tasks.convert import distribute

    monkeypatch.setattr(distribute, "POOL_MIN_IMAGES", 0)  # a pool even for 26 images (else converted in-process)
    opened = []
    monkeypatch.setattr(distribute, "process_pool", lambda n, real=distribute.process_pool: opened.append(n) or real(n))

    reference = make_job(tmp_path / "ref", shard_mb=0.03, row_group_rows=5, max_bad_fraction=0.1)
    _project(tmp_path / "ref")
    run_local(reference, progress=False)
    local = run(str(_project(tmp_path / "local", workers=2, task_runner="local")))
    assert opened == [2]
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        params = _project(tmp_path / "dask", task_runner="dask", dask_address=cluster.scheduler_address)
        dask = run(str(params))
    assert local["splits"] == dask["splits"] and local["splits"]["train"]["shards"] > 2
    assert local["rows"] == 25 and local["bad_images"] == 1
    expected = shard_bytes(reference)
    for root in ("local", "dask"):
        assert shard_bytes(make_job(tmp_path / root)) == expected, root
    metrics = yaml.safe_load((tmp_path / "dask/data/metrics/convert.json").read_text())
    timings = yaml.safe_load((tmp_path / "dask/data/scratch/logs/convert.json").read_text())  # not DVC-hashed
    assert metrics["splits"]["train"]["rows"] == 25 and timings["images_per_s"] > 0


def test_stage_command_fails_cleanly_above_max_bad_fraction(prefect_api, tmp_path):
    params = _project(tmp_path, max_bad_fraction=0.01, workers=1)
    proc = subprocess.run([sys.executable, "-m", "flows.convert"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "error: " in proc.stderr and "max_bad_fraction=0.01" in proc.stderr and "found 1 of 26" in proc.stderr
    assert params.is_file() and '"zero.JPEG"' in (tmp_path / "data/parquet/bad_images.jsonl").read_text()


def test_dask_runner_needs_an_address(tmp_path):
    from tasks.common import PipelineError

    with pytest.raises(PipelineError, match="convert.dask_address: expected a scheduler address"):
        section("convert", task_runner="dask", dask_address=None, workers=2)


@pytest.mark.parametrize(("workers", "sizes", "pool"), [
    (2, [1_000, 1_500], True), (2, [400] * 4, False), (2, [5_000], False), (1, [3_000, 3_000], False)])
def test_a_pool_opens_only_when_two_workers_would_pay_for_their_start(monkeypatch, workers, sizes, pool):
    from types import SimpleNamespace

    from tasks.convert import distribute

    opened = []

    class Fake:
        def __init__(self, n: int) -> None:
            opened.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(distribute, "process_pool", Fake)
    plans = [SimpleNamespace(start=0, stop=n) for n in sizes]
    with distribute.local_pool(distribute.Distribution("local", workers), plans):  # type: ignore[arg-type]
        inside = list(distribute._POOLS)
    assert (opened == [workers] and len(inside) == 1) if pool else (opened == [] and inside == [])
    assert distribute._POOLS == []

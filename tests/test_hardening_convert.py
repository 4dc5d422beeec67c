"""Hardening of convert (issue 14): no orphan after kill -9, a broken pool explained, implausible JPEGs quarantined,
no timings in the DVC-hashed metrics, ENOSPC / EROFS checked and explained."""
from __future__ import annotations

import contextlib
import errno
import io
import json
import shutil
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image

from tasks.common import PipelineError
from tasks.convert import imaging
from tasks.convert import stage as convert_stage
from tasks.convert.distribute import run_local
from tests.helpers.datasets import flat_dataset, make_job
from tests.helpers.images import jpeg, noisy_jpeg
from tests.helpers.project import REPO


def _dataset(root: Path, count: int = 24) -> None:
    flat_dataset(root, [("n01440764", f"n01440764_{i}.JPEG", noisy_jpeg(i, size=(160, 120))) for i in range(count)])


def _declaring(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header claims width x height."""
    data = bytearray(jpeg(size=(16, 16)))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def test_a_tiny_jpeg_declaring_huge_dimensions_is_quarantined_not_passed_through(tmp_path):
    bomb = _declaring(12000, 12000)  # 144 MP: under max_image_pixels, 432 MB once decoded
    assert len(bomb) < 1000
    for policy in (imaging.Policy(), imaging.Policy(policy="reencode"), imaging.Policy(full_decode=True)):
        with pytest.raises(imaging.BadImage, match=r"^implausible_size: 12000x12000 declared \(2250000 8x8 blocks"):
            imaging.encode_image(bomb, policy)
    flat = io.BytesIO()
    Image.new("RGB", (2048, 2048), (90, 90, 90)).save(flat, "JPEG", quality=50)  # as flat as an image can be
    assert imaging.encode_image(flat.getvalue(), imaging.Policy()).transform == "none"
    flat_dataset(tmp_path, [("n01440764", "n01440764_0.JPEG", bomb), ("n01440764", "n01440764_1.JPEG", jpeg())])
    job = make_job(tmp_path, max_bad_fraction=0.5)
    assert run_local(job, progress=False)["bad_images"] == 1
    [record] = [json.loads(line) for line in (job.parquet / "bad_images.jsonl").read_text().splitlines()]
    assert record["name"] == "n01440764_0.JPEG" and record["reason"].startswith("implausible_size: 12000x12000")


def test_convert_metrics_hold_no_timings_and_rerun_byte_identical(tmp_path):
    _dataset(tmp_path, 8)
    job = make_job(tmp_path)
    run_local(job, progress=False)
    first = job.metrics.read_bytes()
    assert not {"seconds", "images_per_s", "mb_per_s", "resumed_shards"} & set(json.loads(first))
    for path in sorted(job.parquet.rglob("*.parquet")):
        path.unlink()  # a forced rerun: every shard written again, another duration
    shutil.rmtree(job.work / "convert")  # without the resume links that would put them back (tasks/convert/relink.py)
    time.sleep(0.01)
    result = run_local(job, progress=False)
    assert job.metrics.read_bytes() == first
    timings = json.loads((job.work / "logs" / "convert.json").read_text())
    assert timings["seconds"] > 0 and timings["resumed_shards"] == 0 and result["images_per_s"] > 0


NO_GUARD = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tasks.common import PipelineError
from tests.helpers.datasets import make_job
from tasks.convert.distribute import run_local
try:
    run_local(make_job(Path({root!r})), workers=2, progress=False)
except PipelineError as err:
    print("PipelineError:", err)
"""


def test_library_use_without_a_main_guard_says_what_to_do(tmp_path):
    _dataset(tmp_path, 4)
    script = tmp_path / "convert_script.py"
    script.write_text(NO_GUARD.format(repo=str(REPO), root=str(tmp_path)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "PipelineError: convert: expected the worker processes" in done.stdout, done.stdout + done.stderr
    assert 'if __name__ == "__main__":' in done.stdout


KILL_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.helpers.datasets import make_job
from tasks.convert import stage
from tasks.convert.distribute import run_local
real = stage.convert_shard
def slow(job, plan):  # a worker busy long enough to outlive its parent if nothing kills it
    Path({root!r}, "busy-" + plan.name).write_text("")
    time.sleep(30)
    return real(job, plan)
stage.convert_shard = slow
import tasks.convert.distribute as d
d.convert_shard = slow
if __name__ == "__main__":
    run_local(make_job(Path({root!r}), shard_mb=0.01), workers=2, progress=False)
"""


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_kill_9_of_convert_leaves_no_worker_forkserver_or_resource_tracker(tmp_path):
    _dataset(tmp_path, 12)
    script = tmp_path / "convert_script.py"
    script.write_text(KILL_SCRIPT.format(repo=str(REPO), root=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("busy-*"))) < 2 and time.monotonic() < deadline:  # both workers converting
            time.sleep(0.1)
        children = _descendants(proc.pid)
        assert len(children) >= 4, [c.cmdline() for c in children]  # resource tracker, forkserver, 2 workers
        os.kill(proc.pid, signal.SIGKILL)  # the stage process only, as an OOM killer or `kill -9 <pid>` would
        proc.wait()
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [(c.pid, c.cmdline()) for c in alive]
    finally:  # whatever happened, leave nothing behind (the children of a failed run are orphans by now)
        proc.kill()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_too_little_free_space_fails_before_writing(tmp_path, monkeypatch):
    _dataset(tmp_path, 4)
    job = make_job(tmp_path)
    real = convert_stage.shutil.disk_usage
    monkeypatch.setattr(convert_stage.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(PipelineError, match=r"data/parquet: expected .* free for the shards .*found 1,000 bytes"):
        run_local(job, progress=False)
    assert not list(job.parquet.rglob("*.parquet"))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_write_error_names_the_path_and_what_to_do(tmp_path, monkeypatch, code):
    _dataset(tmp_path, 4)
    job = make_job(tmp_path)

    def failing(*_args, **_kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(convert_stage, "write_shard", failing)
    with pytest.raises(PipelineError) as err:
        run_local(job, progress=False)
    message = str(err.value)
    assert str(job.parquet / "train") in message and os.strerror(code) in message and f"errno {code}" in message
    assert "paths.parquet" in message and "run again" in message

"""The download stage's stat-only no-op (tasks/acquire/unchanged.py): nothing to do only when the flow would write
the download.json that is there, by stat alone; every case only the flow can judge runs the flow. The state is made
by the flow's own task functions (plain functions, no Prefect); `python -m flows.download` is run for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.acquire import download as dl
from tasks.acquire import download_json, obtain
from tasks.acquire.remote import FetchOptions
from tasks.acquire.unchanged import unchanged
from tasks.common import ARCHIVES
from tests.helpers.project import REPO

SMALL = {"classes": 2, "train_per_class": 2, "val_per_class": 1, "seed": 0}


def _project(root: Path, **download: object) -> dl.Download:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sample"] = dict(SMALL)
    params["download"].update(download)
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "curation").mkdir(exist_ok=True)
    for name in ("exclude.csv", "relabel.csv"):
        shutil.copy(REPO / "curation" / name, root / "curation" / name)
    from tasks.common.params import load_project

    return dl.plan(load_project(root / "params.yaml"))


def _run_flow_tasks(job: dl.Download) -> None:
    """What download_flow does, with its task functions called directly."""
    records = obtain.fetch_sample(job.raw_dir, job.sample, job.cache_file) if job.uses_sample else {}
    for name, source in job.fetched().items():
        records[name] = obtain.fetch_archive(name, source, job.raw_dir, FetchOptions(), job.cache_file, job.root)
    download_json.write_download_json(job.raw_dir, job.source, records)


def test_sample_then_linked_archives(tmp_path: Path) -> None:
    job = _project(tmp_path / "p")
    assert not unchanged(job), "no download.json yet"
    _run_flow_tasks(job)
    assert unchanged(job)
    (job.raw_dir / ".ILSVRC2012_img_val.tar.tmp-99999999").write_bytes(b"x")  # a killed run's temporary
    assert not unchanged(job)
    (job.raw_dir / ".ILSVRC2012_img_val.tar.tmp-99999999").unlink()
    os.utime(job.raw_dir / ARCHIVES["val"])  # touched: its MD5 must be checked again (by the flow)
    assert not unchanged(job)

    source = tmp_path / "archives"
    shutil.copytree(job.raw_dir, source, ignore=shutil.ignore_patterns("*.json"))
    linked = _project(tmp_path / "q", source=str(source))
    _run_flow_tasks(linked)
    assert unchanged(linked)
    (linked.raw_dir / ARCHIVES["devkit"]).unlink()  # the link gone
    assert not unchanged(linked)
    _run_flow_tasks(linked)
    assert unchanged(linked)
    (linked.raw_dir / "sample_md5.tsv").write_text("name\tmd5\n")  # a stale sample table: the flow removes it
    assert not unchanged(linked)


def test_a_network_source_always_runs_the_flow(tmp_path: Path) -> None:
    job = _project(tmp_path / "p", source="http://127.0.0.1:9/archives")
    (job.raw_dir).mkdir(parents=True)
    (job.raw_dir / "download.json").write_text(json.dumps({"source": job.source, "archives": {}}))
    assert not unchanged(job)


@pytest.mark.parametrize("changed", [False, True])
def test_the_stage_command_exits_early_only_when_unchanged(tmp_path: Path, changed: bool) -> None:
    job = _project(tmp_path / "p")
    _run_flow_tasks(job)
    if changed:
        (job.raw_dir / "download.json").write_text("{}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    probe = "import runpy, sys; runpy.run_module('flows.download', run_name='__main__')"
    if changed:  # the flow would start: stop it at Prefect's import instead (no server here)
        probe = "import sys; sys.modules['prefect'] = None; " + probe
    done = subprocess.run([sys.executable, "-c", probe], cwd=job.root, env=env, capture_output=True, text=True)
    if changed:
        assert "download: nothing to do" not in done.stdout and "prefect" in done.stderr.lower()
    else:
        assert done.returncode == 0 and "download: nothing to do" in done.stdout, done.stdout + done.stderr
        assert "prefect" not in done.stderr.lower()

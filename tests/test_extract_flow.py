"""The extract flow against a real Prefect server, and the stage command's clean failure."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from tasks.common import ARCHIVES
from tests.helpers.params import write_params
from tests.helpers.project import REPO


def make_project(root: Path, sample: Path, **extract_params) -> Path:
    """params.yaml (the repo's, with `extract:` overrides) + data/raw linking the sample archives."""
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    for name in ARCHIVES.values():
        (raw / name).symlink_to(sample / name)
    write_params(root, extract=extract_params)
    return root


def test_flow_on_sample_with_imagefolder(prefect_api, sample_release, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    from flows.extract import extract_flow

    monkeypatch.chdir(make_project(tmp_path, sample_release, materialize=True))
    started = datetime.now(UTC)  # the server is the session's: other tests' runs are there too
    report = extract_flow()
    assert report["images"] == {"train": 200, "val": 50} and report["imagefolder"] == "data/scratch/imagefolder"
    rows = pq.read_table("data/manifests/train.parquet").to_pylist()
    assert {r["source"] for r in rows} == {"data/raw/ILSVRC2012_img_train.tar"}  # the link's name, in the repo
    files = sorted(p.relative_to("data/scratch/imagefolder").as_posix() for p in Path("data/scratch/imagefolder").rglob("*.JPEG"))
    assert len(files) == 250 and files[0].startswith("train/n")
    assert json.loads(Path("data/label_map.json").read_text())["num_classes"] == 10
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["extract"])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=started)),
        )
        assert runs and all(r.state.is_completed() for r in runs)
        task_names = {t.name.rsplit("-", 1)[0] for t in client.read_task_runs()}
    assert {"scan", "write-manifests", "materialize-imagefolder"} <= task_names


def test_stage_command_fails_cleanly(prefect_api, sample_release, tmp_path):
    project = make_project(tmp_path, sample_release, classes="imagenet100")
    proc = subprocess.run([sys.executable, "-m", "flows.extract"], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # the code: the checkout
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "error: " in proc.stderr and "expected every class of extract.classes in train" in proc.stderr
    assert not (project / "data" / "manifests").exists() and not (project / "data" / "label_map.json").exists()


def test_dvc_stage_tracks_index_not_imagefolder(prefect_api, sample_release, project_copy):
    """`dvc repro -s extract` with materialize: true: the lock lists manifests + label map only, and touching
    the ImageFolder tree leaves the stage up to date (DVC never hashes it)."""
    raw = make_project(project_copy, sample_release, materialize=True) / "data" / "raw"
    (raw / "verify.json").write_text(json.dumps({"checksums": "sample", "archives": {}}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    dvc = [sys.executable, "-m", "dvc", "repro", "-s", "extract"]
    first = subprocess.run(dvc, cwd=project_copy, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    lock = yaml.safe_load((project_copy / "dvc.lock").read_text())["stages"]["extract"]
    assert sorted(out["path"] for out in lock["outs"]) == ["data/label_map.json", "data/manifests"]
    image = next((project_copy / "data/scratch/imagefolder/val").rglob("*.JPEG"))
    image.write_bytes(b"changed")
    second = subprocess.run(dvc, cwd=project_copy, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "didn't change" in second.stdout, second.stdout + second.stderr

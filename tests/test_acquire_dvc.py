"""`dvc repro download verify` in a fresh copy of the project, the way a new user runs it (`.venv/bin/dvc` with
nothing activated): sample first, then linked local archives, then one of them replaced at the source."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tasks.common import ARCHIVES
from tests.helpers.docs import readme_params
from tests.helpers.project import unactivated_dvc


def _repro(project: Path) -> str:
    done = unactivated_dvc(project, "repro", "download", "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_dvc_repro_runs_then_skips_sample_and_linked_archives(project_copy: Path, prefect_api: str,
                                                               sample_release: Path, tmp_path: Path):
    raw = project_copy / "data" / "raw"
    first = _repro(project_copy)
    assert "Running stage 'download'" in first and "Running stage 'verify'" in first
    verdict = json.loads((raw / "verify.json").read_text())
    assert verdict["checksums"] == "sample" and all(a["ok"] for a in verdict["archives"].values())
    lock = (project_copy / "dvc.lock").read_bytes()
    second = _repro(project_copy)  # download always runs (it stats its sources), and changes nothing here
    assert "Stage 'verify' didn't change, skipping" in second
    # ... without starting Prefect: the stat-only check (tasks/acquire/unchanged.py) finds nothing to do
    assert "download: nothing to do" in second and "Flow run" not in second, second
    assert (project_copy / "dvc.lock").read_bytes() == lock, "unchanged inputs must leave dvc.lock byte-identical"

    source = tmp_path / "archives"
    shutil.copytree(sample_release, source)
    params = project_copy / "params.yaml"
    linked = readme_params("own-ilsvrc2012", download__source=str(source))["download"]  # the README's one line
    text = params.read_text().replace("  source: sample", f"  source: {linked['source']}", 1)
    params.write_text(text.replace("checksums: auto", f"checksums: {source / 'sample_md5.tsv'}", 1))
    third = _repro(project_copy)
    assert "Running stage 'download'" in third and "Running stage 'verify'" in third
    assert "download: nothing to do" not in third, "another source: the flow must run"
    records = json.loads((raw / "download.json").read_text())["archives"]
    assert {r["method"] for r in records.values()} == {"local"} and all(r["md5"] for r in records.values())
    assert all(os.path.samefile(raw / name, source / name) for name in ARCHIVES.values())
    cache = json.loads((project_copy / "data" / "scratch" / "md5_cache.json").read_text())
    # the archives are not DVC outs (download.json stands for them): the download stage hashed each once (train and
    # val in the pass that indexed them for extract), verify reused that, DVC hashed nothing
    origins = {name: cache[str((raw / name).resolve())]["origin"] for name in ARCHIVES.values()}
    assert origins == {name: f"download {source / name}" for name in ARCHIVES.values()}
    verified = json.loads((raw / "verify.json").read_text())["archives"]
    for split in ("train", "val"):  # the index made in the same read, for the extract stage (tests/test_archive_pass)
        prescan = json.loads((project_copy / "data" / "scratch" / "prescan" / f"{split}.json").read_text())
        assert prescan["md5"] == verified[ARCHIVES[split]]["md5"] == records[ARCHIVES[split]]["md5"]
    assert not (raw / "sample_md5.tsv").exists()
    cached = [p for p in (project_copy / ".dvc" / "cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size < 1 << 20 for p in cached), "raw archives must never enter the DVC cache"
    again = _repro(project_copy)  # linked archives unchanged: the stat-only no-op, download.json untouched
    assert "download: nothing to do" in again and "Stage 'verify' didn't change, skipping" in again

    val, train = source / ARCHIVES["val"], source / ARCHIVES["train"]
    val.unlink()
    shutil.copy(train, val)  # replaced at the source (rm + cp of another file), the table updated to match
    md5 = dict(line.split("\t") for line in (source / "sample_md5.tsv").read_text().splitlines()[1:])
    md5[ARCHIVES["val"]] = md5[ARCHIVES["train"]]
    (source / "sample_md5.tsv").write_text("name\tmd5\n" + "".join(f"{n}\t{m}\n" for n, m in md5.items()))
    fourth = _repro(project_copy)  # a plain `dvc repro` notices it (the MD5 in download.json changed)
    assert "Running stage 'verify'" in fourth and "download: nothing to do" not in fourth
    assert os.path.samefile(raw / ARCHIVES["val"], val)

"""`dvc repro download verify` in a fresh copy of the project: sample first, then linked local archives."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tasks.common import ARCHIVES


def _repro(project: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["dvc", "repro", "download", "verify"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_dvc_repro_runs_then_skips_sample_and_linked_archives(project_copy: Path, prefect_api: str,
                                                               sample_release: Path):
    raw = project_copy / "data" / "raw"
    first = _repro(project_copy)
    assert "Running stage 'download'" in first and "Running stage 'verify'" in first
    verdict = json.loads((raw / "verify.json").read_text())
    assert verdict["checksums"] == "sample" and all(a["ok"] for a in verdict["archives"].values())
    second = _repro(project_copy)
    assert "Stage 'download' didn't change, skipping" in second
    assert "Stage 'verify' didn't change, skipping" in second

    params = project_copy / "params.yaml"
    text = params.read_text().replace("  source: sample", f"  source: {sample_release}", 1)
    params.write_text(text.replace("checksums: auto", f"checksums: {sample_release / 'sample_md5.tsv'}", 1))
    third = _repro(project_copy)
    assert "Running stage 'download'" in third and "Running stage 'verify'" in third
    records = json.loads((raw / "download.json").read_text())["archives"]
    assert {r["method"] for r in records.values()} == {"hardlink"}
    assert all(os.path.samefile(raw / name, sample_release / name) for name in ARCHIVES.values())
    cache = json.loads((project_copy / "data" / "scratch" / "md5_cache.json").read_text())
    # DVC hashed the linked outs once; verify took those MD5s from DVC's state instead of reading again
    assert {cache[str((raw / name).resolve())]["origin"] for name in ARCHIVES.values()} == {"dvc-state"}
    assert not (raw / "sample_md5.tsv").exists()
    cached = [p for p in (project_copy / ".dvc" / "cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size < 1 << 20 for p in cached), "raw archives must never enter the DVC cache"

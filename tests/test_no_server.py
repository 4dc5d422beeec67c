"""`dvc repro` must work with no Prefect server running: a stage command then starts Prefect's temporary server."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_stage_runs_without_a_prefect_server(project_copy: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # a fresh home: nothing configured, no server known
    env["PREFECT_LOGGING_LEVEL"] = "INFO"
    done = subprocess.run([sys.executable, "-m", "dvc", "repro", "-s", "download"], cwd=project_copy, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "temporary server" in done.stdout + done.stderr  # Prefect's own ephemeral server, not ours
    assert (project_copy / "data/raw/ILSVRC2012_img_train.tar").stat().st_size > 0
    assert (project_copy / "data/raw/download.json").is_file()

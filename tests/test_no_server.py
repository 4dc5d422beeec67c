"""`dvc repro` must work with no Prefect server running: the first stage command starts one server for the run
(tasks.common.prefect_server), the next stages reuse it, and it stops by itself once unused."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tasks.common.prefect_server import IDLE_ENV, LEASE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_stages_share_one_server_that_stops_when_unused(project_copy: Path, tmp_path: Path):
    home = tmp_path / "prefect-home"  # a fresh home: nothing configured, no server known
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL")}
    env.update({"PREFECT_HOME": str(home), "PREFECT_LOGGING_LEVEL": "INFO", IDLE_ENV: "15"})
    done = subprocess.run([sys.executable, "-m", "dvc", "repro", "download", "verify"], cwd=project_copy, env=env,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert (project_copy / "data/raw/verify.json").is_file()
    assert "temporary server" not in out  # not Prefect's own per-process server
    for noise in ("Traceback", "Failed to send telemetry", "database is locked"):
        assert noise not in out, out[-3000:]
    keepers = [line for line in (home / "imagenet-parquet-server.log").read_text().splitlines()
               if line.startswith("keeper ") and "Prefect server at" in line]
    assert len(keepers) == 1, keepers  # two stages, one server
    pid = int(keepers[0].split()[1].rstrip(":"))
    deadline = time.monotonic() + 90
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(pid), "the keeper outlived its idle timeout"
    assert not (home / "imagenet-parquet-server.json").exists() and (home / LEASE).exists()

"""Shared fixtures: an isolated Prefect home, one real Prefect server per test session, the sample release."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
# This module may be imported twice (as pytest's conftest and by `from conftest import ...`): the session's
# Prefect home and API address are chosen once and kept in the environment.
_SESSION_KEY = "IMAGENET_PARQUET_TEST_SESSION"
if _SESSION_KEY not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")  # before anything imports prefect
_PREFECT_HOME = os.environ["PREFECT_HOME"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Prefect reads its settings once, when first imported (test collection imports it): point the whole session —
# this process and every child — at the one server the `prefect_api` fixture starts before any test runs.
os.environ.setdefault(_SESSION_KEY, f"http://127.0.0.1:{free_port()}/api")
_API_URL = os.environ["PREFECT_API_URL"] = os.environ[_SESSION_KEY]
os.environ["PREFECT_UI_API_URL"] = _API_URL  # the UI calls this address
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


def wait_http(url: str, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(scope="session", autouse=True)
def prefect_api() -> str:
    """A real `prefect server start` on 127.0.0.1, at the PREFECT_API_URL set above, for the whole session."""
    port = _API_URL.rsplit(":", 1)[1].split("/")[0]
    log = open(Path(_PREFECT_HOME) / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", port],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PREFECT_UI_ENABLED": "true"},
    )
    try:
        wait_http(_API_URL + "/health", timeout=90)
    except Exception:
        proc.kill()
        raise RuntimeError((Path(_PREFECT_HOME) / "server.log").read_text()[-3000:])
    yield _API_URL
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip (real-data tests run in CI, where it exists)."""
    if not (SHARED / "imagenet").is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED


@pytest.fixture(scope="session")
def sample_release(tmp_path_factory) -> Path:
    """The built-in sample (default size), written once per session: the three archives + sample_md5.tsv."""
    from tasks.acquire.sample import write_sample

    out = tmp_path_factory.mktemp("sample-release")
    write_sample(out)
    return out


def copy_project(dest: Path) -> Path:
    """Copy the working tree (tracked + untracked-not-ignored files; no data/, no .venv) into a fresh git repo.

    Tests that run `dvc repro` / `dvc push` / a deployment work on such a copy, never on the checkout."""
    import shutil

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in sorted(filter(None, listed)):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@127.0.0.1"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


@pytest.fixture
def project_copy(tmp_path) -> Path:
    """A fresh git + DVC copy of the project (see copy_project)."""
    return copy_project(tmp_path / "project")

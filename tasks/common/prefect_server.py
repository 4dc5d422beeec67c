"""One Prefect server per pipeline run, not one per stage.

Without `PREFECT_API_URL`, each stage command used to start Prefect's temporary server (a fresh uvicorn process,
~5-20 s, once per stage) and stop it again. Now the first stage starts a *keeper* (`python -m
tasks.common.prefect_server`, detached) that runs `prefect server start` on a free 127.0.0.1 port and records it
in `$PREFECT_HOME/imagenet-parquet-server.json`; later stages find it healthy and reuse it (~0.1 s).

Nothing is left running for ever: every stage holds a shared lock on `$PREFECT_HOME/imagenet-parquet-server.lease`
while it runs (released by the kernel even when the stage is killed); the keeper stops the server and exits once
nobody has held the lease for `IMAGENET_PARQUET_SERVER_IDLE_S` seconds (default 600), or when the server dies.
The server dies with its keeper (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.common.errors import PipelineError
from tasks.common.procs import die_with_parent

STATE = "imagenet-parquet-server.json"
LEASE = "imagenet-parquet-server.lease"
SPAWN = "imagenet-parquet-server.spawn"
IDLE_ENV = "IMAGENET_PARQUET_SERVER_IDLE_S"
IDLE_S = 600.0
START_TIMEOUT_S = 300.0  # a fresh database migrates first; a loaded machine is slow


def prefect_home() -> Path:
    """Prefect's own PREFECT_HOME (env, else ~/.prefect), where its database lives."""
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _state(home: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((home / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if healthy(str(state.get("url", ""))) else None


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def shared_server(home: Path | None = None) -> Iterator[str]:
    """Yield the API URL of the run's server (reused, else started), holding the lease until the block ends."""
    home = home or prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / LEASE, fcntl.LOCK_SH):
        with _locked(home / SPAWN, fcntl.LOCK_EX):  # one stage starts it; the others wait and reuse it
            state = _state(home) or _start_keeper(home)
        try:
            yield str(state["url"])
        finally:
            os.utime(home / LEASE)  # the idle clock starts when the last user leaves


def _start_keeper(home: Path) -> dict[str, Any]:
    (home / STATE).unlink(missing_ok=True)
    log = open(home / "imagenet-parquet-server.log", "ab")  # noqa: SIM115 - handed to the detached keeper
    with log:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "tasks.common.prefect_server", str(home)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this stage, not its terminal's Ctrl-C
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = _state(home)
        if state is not None:
            return state
        if keeper.poll() is not None:
            break
        time.sleep(0.2)
    keeper.kill()
    tail = (home / "imagenet-parquet-server.log").read_text(errors="replace")[-2000:]
    raise PipelineError(
        f"{home / 'imagenet-parquet-server.log'}: expected a Prefect server to answer within {START_TIMEOUT_S:.0f} s, "
        f"found none; set PREFECT_API_URL to a running server (`make server`) and run again. Log tail:\n{tail}"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def keep(home: Path, idle_s: float) -> None:
    """The keeper: run the server, publish it, stop it when unused for idle_s seconds (or when it died)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.setdefault("PREFECT_UI_ENABLED", "false")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),  # the server ends with its keeper
    )
    try:
        while not healthy(url) and server.poll() is None:
            time.sleep(0.2)
        tmp = home / f".{STATE}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"url": url, "keeper": os.getpid(), "server": server.pid}), encoding="utf-8")
        os.replace(tmp, home / STATE)
        print(f"keeper {os.getpid()}: Prefect server at {url}, stopped after {idle_s:.0f} s unused", flush=True)
        _watch(home, server, idle_s)
        print(f"keeper {os.getpid()}: {'unused' if server.poll() is None else 'server exited'}, stopping", flush=True)
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def _watch(home: Path, server: subprocess.Popen[bytes], idle_s: float) -> None:
    while server.poll() is None:
        time.sleep(1.0)
        with _locked(home / LEASE, fcntl.LOCK_SH) as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # only when no stage holds the lease
            except BlockingIOError:
                continue
            if time.time() - os.stat(home / LEASE).st_mtime > idle_s:
                (home / STATE).unlink(missing_ok=True)  # under the exclusive lease: no stage is reading it
                return


if __name__ == "__main__":
    keep(Path(sys.argv[1]), float(os.environ.get(IDLE_ENV, IDLE_S)))

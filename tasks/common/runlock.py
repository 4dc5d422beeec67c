"""One pipeline run of a project at a time.

`dvc repro` holds its repository lock only between stages (it lets go while a stage's command runs) and locks
only the running stage's deps and outs; the archives under paths.raw are no DVC out (download.json stands for
them). A second `dvc repro` in the same checkout can so run its download stage — replacing archives — while the
first one's extract or convert reads them. Every stage therefore claims the project's run first
(`<paths.work>/pipeline-run.json`): the run is the `dvc` process that started the stage (its nearest ancestor
running dvc; a stage started by hand is a run of its own), recorded with its start time. Another live run's claim
refuses the stage with one clear line; a finished or killed run's claim is taken over. Claims are serialized by an
flock. (Where /proc is missing, the run is the process group.)"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from tasks.common.errors import PipelineError
from tasks.common.files import write_json

CLAIM = "pipeline-run.json"


def claim_run(work: Path, stage: str) -> None:
    """Claim the project's pipeline run for this stage's run, or PipelineError while another live run holds it."""
    work.mkdir(parents=True, exist_ok=True)
    pid = _run_pid()
    mine = {"pid": pid, "start": _start(pid)}
    with open(work / f".{CLAIM}.flock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released on close, or by the kernel when killed
        held = _held(work / CLAIM)
        if held and {k: held.get(k) for k in mine} != mine and _running(held):
            raise PipelineError(
                f"{work / CLAIM}: expected no other run of this project's pipeline, found one running (stage "
                f"{held.get('stage')}, process {held.get('pid')}: {held.get('command')}, since {held.get('since')}); "
                "wait for it to finish (or stop it), then run `dvc repro` again. Two runs at once would replace the "
                "archives one of them reads; a killed run leaves no process, and its claim is then taken over"
            )
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_json(work / CLAIM, {**mine, "command": _command(pid), "stage": stage, "since": when})


def _held(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        held = json.loads(path.read_text(encoding="utf-8"))
        return held if isinstance(held, dict) and isinstance(held.get("pid"), int) else None
    return None


def _run_pid() -> int:
    """The nearest ancestor running dvc (`dvc repro`, `python -m dvc repro`), else this process; without /proc
    the process group."""
    if not Path("/proc/self/stat").exists():
        return os.getpgid(0)
    pid = os.getpid()
    while pid > 1:
        if any(part == "dvc" or part.endswith("/dvc") for part in _command(pid).split(" ")[:3]):
            return pid
        pid = _parent(pid)
    return os.getpid()


def _running(held: dict[str, Any]) -> bool:
    """The claiming run's process is alive (and its number was not reused by a later process)."""
    pid = held["pid"]
    try:
        os.kill(pid, 0) if Path("/proc/self/stat").exists() else os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return held.get("start") in (None, _start(pid))


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (field 3 first); [] where unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def _start(pid: int) -> int | None:
    """When process `pid` started (field 22), None where unknown."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""

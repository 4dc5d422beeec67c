"""Run DVC as a subprocess in the project, stream its output line by line, and tell which stages ran.

Which stages ran is read from `dvc repro`'s own per-stage lines (DVC 3: "Running stage 'x':", "Stage 'x' didn't
change, skipping", "Stage 'x' is cached - skipping run, ...", "failed to reproduce 'x'") and cross-checked against
dvc.lock before and after the run: a stage whose dvc.lock entry changed although no line said it ran is reported
(`lock_drift`), so a change in DVC's wording cannot go unnoticed.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

RAN, RESTORED, SKIPPED, FAILED, NOT_REACHED = (
    "ran",
    "restored from run-cache",
    "skipped (unchanged)",
    "failed",
    "not reached",
)
_STAGE_LINE = re.compile(
    r"Running stage '(?P<ran>[^']+)':"
    r"|Stage '(?P<restored>[^']+)' is cached - skipping run"
    r"|'(?P<skipped>[^']+)' didn't change, skipping"
    r"|failed to reproduce '(?P<failed>[^']+)'"
)
_GROUPS = {"ran": RAN, "restored": RESTORED, "skipped": SKIPPED, "failed": FAILED}


@dataclass
class DvcRun:
    """What a DVC command did: exit status, per-stage outcomes seen in its output, the last lines."""

    returncode: int
    seen: dict[str, str] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


def dvc_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for DVC and the stage commands it starts: this interpreter's bin dir first on PATH (the
    stages run `python -m flows.<stage>`), unbuffered Python output (lines arrive as they are printed)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def stream_lines(stream: IO[bytes], progress_every: float = 5.0) -> Iterable[str]:
    """Lines of a process's output as they arrive. Progress-bar redraws (lines ended by a bare CR) are passed on
    at most once every `progress_every` seconds; empty lines are dropped."""
    last_progress = -math.inf
    for raw in io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline=""):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        if raw.endswith("\r"):
            if time.monotonic() - last_progress < progress_every:
                continue
            last_progress = time.monotonic()
        yield text


def run_dvc(
    args: list[str],
    project: Path,
    on_line: Callable[[str], None],
    env: dict[str, str] | None = None,
    tail_lines: int = 40,
) -> DvcRun:
    """Run `dvc <args>` in `project`; pass each output line (stdout and stderr merged) to `on_line` as it comes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", *args],
        cwd=project,
        env=env or dvc_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    seen: dict[str, str] = {}
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    try:
        assert proc.stdout is not None  # stdout=PIPE
        for line in stream_lines(proc.stdout):
            on_line(line)
            tail.append(line)
            match = _STAGE_LINE.search(line)
            if match:
                group = next(name for name, value in match.groupdict().items() if value)
                seen[match[group]] = _GROUPS[group]
    finally:
        returncode = proc.wait()
    return DvcRun(returncode, seen, list(tail))


def _stages(path: Path) -> dict[str, Any]:
    """The `stages:` mapping of a dvc.yaml or dvc.lock file."""
    with open(path, encoding="utf-8") as fh:
        stages: dict[str, Any] = (yaml.safe_load(fh) or {}).get("stages", {})
    return stages


def stage_names(project: Path) -> list[str]:
    """The stages of the project's dvc.yaml, in file order."""
    return list(_stages(project / "dvc.yaml"))


def lock_entries(project: Path) -> dict[str, Any]:
    """dvc.lock's per-stage entries ({} before the first run)."""
    lock = project / "dvc.lock"
    return _stages(lock) if lock.exists() else {}


def stage_outcomes(
    stages: list[str], run: DvcRun, before: dict[str, Any], after: dict[str, Any]
) -> list[dict[str, str]]:
    """One row per stage: its outcome in this run and whether its dvc.lock entry changed."""
    seen = dict(run.seen)
    ran = [stage for stage, outcome in seen.items() if outcome == RAN]
    if run.returncode != 0 and FAILED not in seen.values() and ran:
        seen[ran[-1]] = FAILED  # DVC stopped without its usual "failed to reproduce" line
    return [
        {
            "stage": stage,
            "outcome": seen.get(stage, NOT_REACHED),
            "dvc.lock": "updated" if before.get(stage) != after.get(stage) else "unchanged",
        }
        for stage in stages
    ]


def lock_drift(rows: list[dict[str, str]]) -> list[str]:
    """Stages whose dvc.lock entry changed although no output line said they ran (should never happen)."""
    return [row["stage"] for row in rows if row["dvc.lock"] == "updated" and row["outcome"] not in (RAN, RESTORED)]


def metrics_rows(metrics_dir: Path) -> list[dict[str, Any]]:
    """Every value of every `<metrics_dir>/*.json` as a row {file, metric (dotted path), value}, sorted."""
    rows = []
    for path in sorted(metrics_dir.glob("*.json")):
        for key, value in _flatten(json.loads(path.read_text(encoding="utf-8"))):
            rows.append({"file": path.name, "metric": key, "value": value})
    return rows


def _flatten(obj: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(obj, dict):
        for key in sorted(obj):
            yield from _flatten(obj[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, list):
        yield prefix, json.dumps(obj)
    else:
        yield prefix, obj

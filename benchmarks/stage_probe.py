"""The per-stage wrapper of benchmarks/bench_pipeline.py: inside its `dvc repro`, each stage command runs as

    env PYTHONPATH=<repository> python -m benchmarks.stage_probe NAME RECORD MIRROR -- CMD...

It drops the page cache of the mirror and the project's data (a cold cache, as for a dataset larger than RAM), runs
CMD (without that PYTHONPATH: the stage imports the project copy's code, as `dvc repro` alone does) and appends to
RECORD (JSON lines) what the stage's process tree did: wall, CPU, bytes read from disk / through read(), bytes
written, peak RSS of its largest process, and DVC's own CPU and I/O before and after it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import IO_KEYS, REPO, cpu_children, cpu_seconds, evict_tree, proc_io, subreaper

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str | Path) -> list[str]:
    """The fields of a /proc/<pid>[/task/<tid>]/stat after the command name (field 3, the state, is [0]); the
    name is skipped whole: it may hold spaces and parentheses."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def stat_cpu(fields: list[str]) -> float:
    """User + system CPU seconds from stat fields (utime, stime)."""
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of the process itself (all its threads, not its children)."""
    return stat_cpu(stat_fields(f"/proc/{pid}/stat"))


def dvc_pid() -> int | None:
    """The nearest ancestor whose command line names dvc (None when there is none)."""
    pid = os.getppid()
    while pid > 1:
        if b"dvc" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(stat_fields(f"/proc/{pid}/stat")[1])
    return None


def dvc_snapshot(pid: int | None) -> dict[str, float]:
    """DVC's own CPU and I/O counters so far (empty without a DVC process)."""
    if pid is None:
        return {}
    return {"cpu": proc_cpu(pid), **proc_io(pid)}


class TreeWatch(threading.Thread):
    """Samples every thread of a process tree (the stage; a shared Prefect server's keeper left out) every `every`
    s: per-thread I/O and CPU counters (they exclude reaped children, so nothing is counted twice) and each
    process's VmHWM. Totals are the last values seen: what a thread did in its last `every` s is missed."""

    def __init__(self, root: int, every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.every, self.stop = root, every, threading.Event()
        self.threads: dict[tuple[int, int, str], dict[str, float]] = {}
        self.hwm: dict[int, int] = {}
        self.own: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every)
        self.own = proc_io("thread-self")  # this thread's own reads of /proc: not the stage's

    def sample(self) -> None:
        for pid in descendants(self.root):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                hwm = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM")), 0)
                self.hwm[pid] = max(self.hwm.get(pid, 0), hwm)
                for tid in sorted(os.listdir(f"/proc/{pid}/task")):
                    stat = stat_fields(f"/proc/{pid}/task/{tid}/stat")
                    row: dict[str, float] = dict(proc_io(f"{pid}/task/{tid}"))
                    row["cpu"] = stat_cpu(stat)
                    self.threads[(pid, int(tid), stat[19])] = row  # (pid, tid, start time): pids are reused
            except (OSError, StopIteration, IndexError, ValueError):
                continue

    def totals(self) -> dict[str, float]:
        keys = ("cpu", *IO_KEYS)
        return {
            **{k: sum(t.get(k, 0) for t in self.threads.values()) for k in keys},
            "maxrss": max(self.hwm.values(), default=0),
        }


def descendants(root: int) -> list[int]:
    """root and every process below it, except a shared Prefect server's keeper and what it started."""
    children: dict[int, list[int]] = {}
    for entry in sorted(os.scandir("/proc"), key=lambda e: e.name):
        if entry.name.isdigit():
            try:
                ppid = int(stat_fields(Path(entry.path, "stat"))[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            if b"prefect_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        found.append(pid)
        todo += children.get(pid, [])
    return found


def run_watched(cmd: list[str]) -> tuple[int, dict[str, float]]:
    """Run cmd as a child subreaper (descendants orphaned on the way stay in the tree, and are reaped here) and
    sample its tree. Each figure is the larger of what the kernel folded into this process on reaping and the
    sum of the samples (the first misses nothing when every process is reaped along the tree; the second only
    each thread's last 0.2 s)."""
    subreaper()
    before = proc_io()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # set only to import this module
    proc = subprocess.Popen(cmd, env=env)
    watch = TreeWatch(proc.pid)
    watch.start()
    rc = proc.wait()
    while [p for p in descendants(os.getpid()) if p != os.getpid()]:  # orphans left behind (a forkserver, ...)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
        time.sleep(0.05)
    watch.stop.set()
    watch.join()
    after, sampled = proc_io(), watch.totals()
    reaped = {"cpu": cpu_children(), **{k: after[k] - before[k] - watch.own.get(k, 0) for k in IO_KEYS}}
    return rc, {**sampled, **{k: max(v, sampled[k]) for k, v in reaped.items()}}


def probe_stages(project: Path, record: Path, mirror: Path, stages: str = r"\w+") -> None:
    """Make the stage commands of `project`'s dvc.yaml whose flow name matches the regex `stages` run under this
    probe, appending to `record` (the page cache of `mirror` and the project's data dropped before each). The probe
    imports this checkout's benchmarks package; the stage it runs, the copy's own code."""
    probe = f"env PYTHONPATH={shlex.quote(str(REPO))} python -m benchmarks.stage_probe"
    stage_cmd = rf"cmd: ((?:scripts/)?python -m flows\.({stages}))"  # scripts/python since issue 14
    dvc = (project / "dvc.yaml").read_text()
    wrapped = re.sub(stage_cmd, lambda m: f"cmd: {probe} {m.group(2)} {record} {mirror} -- {m.group(1)}", dvc)
    if wrapped == dvc:
        raise ValueError(f"{project / 'dvc.yaml'}: no stage command matches flows.{stages}")
    (project / "dvc.yaml").write_text(wrapped)


def wrap_stage(argv: list[str]) -> int:
    """`NAME RECORD MIRROR -- CMD...`: run CMD cold, append its measurements to RECORD (JSON lines)."""
    name, record, mirror, sep, *cmd = argv
    assert sep == "--" and cmd, argv
    evict_tree([Path("data"), Path(".dvc") / "cache", Path(mirror)])
    parent = dvc_pid()
    before_dvc, start = dvc_snapshot(parent), time.time()
    rc, tree = run_watched(cmd)
    end, after_dvc = time.time(), dvc_snapshot(parent)
    # what DVC's /proc/<pid>/io will have folded in once it reaps this process: subtracted from DVC's own
    row = {
        "stage": name,
        "start": start,
        "end": end,
        "rc": rc,
        **tree,
        "dvc_before": before_dvc,
        "dvc_after": after_dvc,
        "folded": {**proc_io(), "cpu": cpu_seconds()},
    }
    with open(record, "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(wrap_stage(sys.argv[1:]))

"""What the benchmarks share: where they work, page-cache eviction, CPU and wall time of this process or of a
command and everything it starts, the load average beside each measurement, project copies with a local DVC remote,
and table printing. One home for helpers that were copied from benchmark to benchmark."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.project import GIT

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "benchmarks" / "_work"  # git-ignored: every benchmark writes under WORK / <its name>
SAMPLES = REPO.parent / "shared" / "data" / "imagenet-samples"  # the 1000 real JPEGs the benchmarks replicate


# ------------------------------------------------------------------------------------------------ page cache
def evict(files: Iterable[str | os.PathLike[str]]) -> None:
    """Drop each file from the page cache (POSIX_FADV_DONTNEED; no root needed, nothing else on the machine is
    touched). Only clean pages can be dropped, so each file's dirty pages are written first (fdatasync)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evict_tree(roots: Iterable[Path]) -> None:
    """`evict` every regular file under `roots` (a sorted walk); files that vanish or refuse (a running pipeline
    renames its outputs) are skipped."""
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                try:
                    evict([os.path.join(dirpath, name)])
                except OSError:
                    continue


# ------------------------------------------------------------------------------------------------ CPU time
def cpu_self() -> float:
    """CPU seconds (user + system) of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    """CPU seconds (user + system) of this process's finished, reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds() -> float:
    """CPU time of this process plus its reaped children (DataLoader workers count once joined): a figure other
    users' load on the machine does not bend, unlike wall time."""
    return cpu_self() + cpu_children()


IO_KEYS = ("rchar", "wchar", "read_bytes", "write_bytes")


def proc_io(pid: int | str = "self") -> dict[str, int]:
    """/proc/<pid>/io's IO_KEYS: bytes through read()/write() and from/to the disk, of the process and every child
    it has reaped (the kernel folds a reaped child's counts in)."""
    rows = (line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return {k: int(v) for k, v in rows if k in IO_KEYS}


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, printed beside a measurement: a busy machine shows in them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


QUIET_WAIT_S = 120.0  # the benchmarks' --quiet-wait default
QUIET_LOAD_PER_CPU = 0.25  # quiet: a 1-minute load average under this x the CPUs this process may use


def quiet_gate(wait_s: float = QUIET_WAIT_S) -> str:
    """The quiet-machine gate before a benchmark times anything: wait (up to `wait_s`, polling every 5 s) until the
    1-minute load average is under QUIET_LOAD_PER_CPU x the usable CPUs, so a measurement does not start while
    another job still runs. Returns the line to print above the tables: the load, and a warning when the machine
    never went quiet (then read CPU seconds and ratios measured in the same run, not wall times)."""
    limit = QUIET_LOAD_PER_CPU * len(os.sched_getaffinity(0))
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(5)
    if os.getloadavg()[0] > limit:
        return (
            f"machine busy: load {loadavg()} above {limit:.2f} after waiting {wait_s:.0f} s; wall times swing, "
            "read CPU s and the ratios measured in this run"
        )
    return f"machine quiet: load {loadavg()} (gate {limit:.2f})"


def add_quiet_wait(parser: Any) -> None:
    """The --quiet-wait option of a benchmark that times things (`quiet_gate`)."""
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=QUIET_WAIT_S,
        help=f"seconds to wait for a quiet machine before timing (default {QUIET_WAIT_S:.0f}; 0: do not wait)",
    )


# ------------------------------------------------------------------------------------------------ commands
def run(cmd: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str:
    """Run `cmd` in `cwd`; its stdout, or exit with the tail of its output when it fails."""
    out = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{list(cmd)} in {cwd} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def subreaper() -> None:
    """Become the child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER): the stages' forkserver pools (convert,
    validate) outlive the process that started them, and orphans would be reaped by init, their CPU lost to
    RUSAGE_CHILDREN; reparented to this process instead, `reap` waits for them and their CPU is counted."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def reap(settle: float = 1.0) -> None:
    """Wait for the orphaned descendants that have exited (or exit within `settle` s of the last one)."""
    deadline = time.perf_counter() + settle
    while time.perf_counter() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            deadline = time.perf_counter() + settle
        else:
            time.sleep(0.05)


def timed(cmd: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of `cmd` and every process it starts (orphans included: see subreaper)."""
    reap(0)
    cpu = cpu_children()
    start = time.perf_counter()
    run(cmd, cwd, env)
    wall = time.perf_counter() - start
    reap()
    return wall, cpu_children() - cpu


MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter(); code = subprocess.run(sys.argv[1:]).returncode; wall = time.perf_counter() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": code, "wall": wall, "cpu": r.ru_utime + r.ru_stime, "rss_mb": r.ru_maxrss / 1024}))
"""


def measured(cmd: Sequence[str], cwd: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """Wall, CPU and peak RSS (largest process) of `cmd` and its children, measured in a child of its own; "out":
    the command's last printed line when it is a JSON object."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], cwd=cwd, env=env, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    found: dict[str, Any] = json.loads(lines[-1])
    if len(lines) > 1 and lines[-2].startswith("{"):
        found["out"] = json.loads(lines[-2])  # what the command printed last (a JSON line)
    if found["rc"]:
        raise SystemExit(f"{list(cmd)} failed in {cwd}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return found


# ------------------------------------------------------------------------------------------------ projects
def dvc_env() -> dict[str, str]:
    """This environment with the running interpreter's bin/ first on PATH (dvc, and `python` for the stage
    commands) and DVC's analytics off."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
    }


def update_params(project: Path, sections: Mapping[str, Mapping[str, object]]) -> None:
    """Set keys of params.yaml sections in a project copy (the other keys, and their order, kept)."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def add_remote(project: Path, remote: Path, env: Mapping[str, str]) -> None:
    """Make `remote` (a directory) the project's default DVC remote; the cache links files when it can."""
    run(["dvc", "remote", "add", "-f", "-d", "local", str(remote)], project, env)
    run(["dvc", "config", "cache.type", "hardlink,copy"], project, env)


def commit_push(project: Path, env: Mapping[str, str], message: str, push: Sequence[str] = ("-q",)) -> None:
    """git add + commit everything, then `dvc push PUSH` (default: every output of every stage)."""
    run(["git", "add", "-A"], project, env)
    run([*GIT, "commit", "-qm", message], project, env)
    run(["dvc", "push", *push], project, env)


def size_of(root: Path) -> int:
    """Bytes of the regular files under `root` (0 when it is absent)."""
    return sum(p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()) if root.exists() else 0


def md5s(root: Path, pattern: str = "*") -> dict[str, tuple[str, int]]:
    """Relative path -> (MD5, bytes) of every file under `root` whose name matches `pattern` (empty when `root` is
    absent); each file streamed through hashlib, never read whole."""
    found = {}
    for path in sorted(root.rglob(pattern)) if root.exists() else []:
        if path.is_file():
            with open(path, "rb") as fh:
                found[str(path.relative_to(root))] = (hashlib.file_digest(fh, "md5").hexdigest(), path.stat().st_size)
    return found


def shard_md5s(project: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """split -> shard name -> (MD5, bytes) of a project's data/parquet (what a new version rewrote)."""
    return {split: md5s(project / "data/parquet" / split, "*.parquet") for split in ("train", "val")}


def unique_jpeg(data: bytes, tag: str | bytes) -> bytes:
    """The same JPEG with a COM segment right after SOI: unique bytes, same pixels."""
    payload = tag.encode() if isinstance(tag, str) else tag
    return data[:2] + b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


# ------------------------------------------------------------------------------------------------ tables
def md_table(header: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1) -> str:
    """A markdown table: the first `left` columns left-aligned, the others right-aligned (numbers)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * left + "---:|" * (len(header) - left)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ruled(head: str) -> str:
    """A fixed-width table's header line and a rule of dashes as long."""
    return head + "\n" + "-" * len(head)

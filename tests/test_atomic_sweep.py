"""A kill -9 mid-write leaves atomic_path's temporary (`.<name>.tmp-<pid>`): the next write of that output, and the
download stage for paths.raw, remove those of processes that are gone, never a live process's (found by CI: a run
killed while the sample's train archive was written left a half archive in data/raw for good)."""
from __future__ import annotations

import os
import subprocess

from tasks.common.files import atomic_path, remove_dead_temporaries


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_dead_processes_temporaries_are_swept_live_ones_kept(tmp_path):
    dead = tmp_path / f".a.tar.tmp-{_dead_pid()}"
    dead.write_bytes(b"half an archive")
    other = tmp_path / f".b.json.tmp-{_dead_pid()}"
    other.mkdir()  # atomic_path writes directories too
    live = tmp_path / f".a.tar.tmp-{os.getppid()}"
    live.write_bytes(b"another run's, still writing")
    with atomic_path(tmp_path / "a.tar") as tmp:
        tmp.write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "a.tar"])
    assert remove_dead_temporaries(tmp_path) == [other]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "a.tar"])

"""Shards put back by hardlink, never converted again: what keeps an append's `dvc repro` at the cost of what changed.

The Parquet directory is not a `persist` DVC out. For a persisted out DVC first copies every file that is a hardlink
or symlink of its cache (`dvc unprotect`): with the project's hardlinked cache that is the whole dataset, read and
written again with twice its disk, before an append of 1 % (measured: docs/results/bench-versions-appends.txt). So
DVC deletes the directory instead (links only: every committed byte stays in its cache) and convert puts back, by
hardlink, the same inodes:
* the shards the layout history lists (`restore_listed`): from the resume link a run left next to their stats when
  those carry the listed md5, else from the DVC cache, which names them by that md5 (tasks/common/dvc_state.py);
  the size must be the listed one. DVC hashes them again as any out unless its state knows the inode.
* the shards a killed run finished (`restore_finished`): from the resume link each finished shard leaves in the
  scratch directory next to its stats (`keep`): same inode, no second copy. The stats still decide (plan.py).
A DVC cache on another filesystem (no hardlink possible) is copied from, under a temporary name, as DVC itself
checks out such a cache. What is in neither place (an object not fetched) stays missing: the history's check then
says to fetch it (history.py); a killed run's shard whose resume link could not be made is converted again."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

from tasks.common import atomic_path
from tasks.common.dvc_state import cached_objects
from tasks.convert.job import Job


def keep(shard: Path, link: Path) -> None:
    """Leave `link` (in the scratch directory) naming the finished `shard`'s inode; none across filesystems."""
    with contextlib.suppress(OSError):
        link.unlink(missing_ok=True)
        os.link(shard, link)


def restore_finished(link: Path, shard: Path) -> None:
    """Put back a killed run's finished shard that DVC deleted (a missing `shard` whose resume `link` exists)."""
    if not shard.exists() and link.is_file():
        with contextlib.suppress(OSError):
            os.link(link, shard)


def restore_listed(job: Job, listed: dict[str, list[dict[str, Any]]]) -> set[Path]:
    """Link back every shard of `listed` (per split, its layout history entries) missing from the Parquet
    directory — one DVC cache lookup for them all; returns the files put back, each from a source named by its
    listed md5 (tasks/convert/listed.py counts them as holding it)."""
    missing = [(split, s) for split, shards in listed.items() for s in shards if not _target(job, split, s).exists()]
    cached = cached_objects(job.parquet, [str(s["md5"]) for _, s in missing]) if missing else {}
    restored = set()
    for split, entry in missing:
        target, size = _target(job, split, entry), entry["file_bytes"]
        target.parent.mkdir(parents=True, exist_ok=True)
        resume, kept = _resume_link(job, split, entry), cached.get(str(entry["md5"]))
        if (resume and _link(resume, target, size)) or (kept and _link(kept, target, size, copy=True)):
            restored.add(target)
    return restored


def _target(job: Job, split: str, entry: dict[str, Any]) -> Path:
    return job.parquet / split / str(entry["name"])


def _resume_link(job: Job, split: str, entry: dict[str, Any]) -> Path | None:
    """The resume link of a listed shard, when its stats carry the listed md5."""
    try:
        stats = json.loads(job.stats_file(split, str(entry["name"])).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(stats, dict) and stats.get("md5") == entry["md5"]
    return job.resume_file(split, str(entry["name"])) if ok else None


def _link(source: Path, shard: Path, size: int, copy: bool = False) -> bool:
    """Hardlink `source` as `shard` when it has `size` bytes, or (`copy`, where no link can be made: another
    filesystem) copy it under a temporary name first; False when neither works (the shard stays missing)."""
    try:
        if source.stat().st_size != size:
            return False
        os.link(source, shard)
    except OSError as err:
        return copy and err.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK) and _copy(source, shard, size)
    return True


def _copy(source: Path, shard: Path, size: int) -> bool:
    try:
        with atomic_path(shard) as tmp:
            shutil.copyfile(source, tmp)
            if tmp.stat().st_size != size:
                raise OSError(f"{source}: changed while copied")
    except OSError:
        return False
    return True

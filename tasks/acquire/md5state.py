"""MD5s that need not be computed twice.

A file's MD5 is remembered against its (size, mtime_ns, inode) — the file as it is on disk now — in two places:
our own small JSON cache (`<paths.work>/md5_cache.json`, works anywhere) and DVC's state database (when the
project is a DVC repo: `dvc repro` then reuses the MD5 for the stage's outs/deps instead of reading 138 GB again,
and an MD5 DVC already computed is reused by `verify`). A changed file (new size, mtime or inode) misses both."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tasks.common import ARCHIVES, write_json
from tasks.common.archive_pass import hash_and_index, save_prescan
from tasks.common.dvc_state import stat_key, state_get, state_put
from tasks.common.layout import PRESCAN
from tasks.common.progress import Progress

CHUNK = 8 << 20
CACHE_NAME = "md5_cache.json"  # under paths.work
SPLIT_OF = {name: split for split, name in ARCHIVES.items() if split != "devkit"}  # archives holding images


def prescan_dir(cache_file: Path) -> Path:
    """Where archive_md5 keeps the tar index made while hashing: beside the MD5 cache, under paths.work."""
    return cache_file.parent / PRESCAN


def _load(cache_file: Path) -> dict[str, dict[str, Any]]:
    try:
        entries: dict[str, dict[str, Any]] = json.loads(cache_file.read_text(encoding="utf-8"))
        return entries
    except (FileNotFoundError, ValueError):
        return {}


def _save(cache_file: Path, entries: dict[str, dict[str, Any]]) -> None:
    write_json(cache_file, entries)


def cached_md5(path: str | os.PathLike[str], cache_file: Path) -> tuple[str | None, str]:
    """(md5, where it came from) when the file is unchanged since an MD5 was recorded, else (None, "")."""
    entry = _load(cache_file).get(os.path.abspath(path))
    if entry and entry.get("key") == stat_key(path):
        return entry["md5"], entry.get("origin", "cache")
    md5 = state_get(path)
    return (md5, "dvc-state") if md5 else (None, "")


def remember_md5(path: str | os.PathLike[str], md5: str, cache_file: Path, origin: str, dvc: bool = True) -> None:
    """Record `md5` for the file as it is now (our cache, and DVC's state when inside a DVC repo)."""
    entries = _load(cache_file)
    entries[os.path.abspath(path)] = {"key": stat_key(path), "md5": md5, "origin": origin}
    _save(cache_file, entries)
    if dvc:
        state_put([(path, md5, stat_key(path))])


def forget_md5(path: str | os.PathLike[str], cache_file: Path) -> None:
    entries = _load(cache_file)
    if entries.pop(os.path.abspath(path), None) is not None:
        _save(cache_file, entries)


def compute_md5(path: str | os.PathLike[str], chunk: int = CHUNK, progress: bool = True) -> str:
    """One sequential pass over the file, with progress (bytes, rate, ETA; plain lines without a terminal)."""
    digest = hashlib.md5()
    size = os.stat(path).st_size
    with open(path, "rb") as fh, Progress(size, f"md5 {Path(path).name}", enabled=progress) as bar:
        while block := fh.read(chunk):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def archive_md5(
    path: Path, cache_file: Path, prescan_dir: Path, origin: str, progress: bool = True, split: str | None = None
) -> tuple[str, str]:
    """(md5, where it came from): reused when the file is unchanged since it was last hashed, else computed — for
    the train and val archives (`split`, else by name: SPLIT_OF) in the same read that indexes their tar headers for
    the extract stage (tasks.common.archive_pass: the index is kept under `prescan_dir`). Recorded with `origin`
    (who hashed it)."""
    md5, seen = cached_md5(path, cache_file)
    if md5:
        if seen == "dvc-state":  # DVC hashed it (e.g. a linked archive tracked elsewhere): keep it here too
            remember_md5(path, md5, cache_file, seen, dvc=False)
        return md5, seen
    split = split or SPLIT_OF.get(path.name)
    if split is None:
        md5 = compute_md5(path, progress=progress)
    else:
        key = stat_key(path)
        found = hash_and_index(path, split, "", progress)
        save_prescan(prescan_dir, split, path, found, key)
        md5 = found.md5
    remember_md5(path, md5, cache_file, origin)
    return md5, "computed"

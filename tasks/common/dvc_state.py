"""What a stage shares with DVC's local storage: MD5s handed to its state database, so `dvc repro` does not read
again what a stage already hashed, and the files of its cache, named by MD5.

DVC remembers a file's MD5 against its inode, mtime and size; an entry saved here for the file as it is now is used
by DVC when it hashes a stage's deps and outs (a changed file misses). Its cache holds every committed file under
its MD5 (`cached_objects`: what convert links back instead of converting again, tasks/convert/relink.py). Outside a
DVC repo every call is a no-op."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dvc.repo import Repo

MD5 = re.compile("[0-9a-f]{32}")  # a name in the cache: never a path of its own


def stat_key(path: str | os.PathLike[str]) -> dict[str, int]:
    """Identity of the bytes behind `path` (a link is followed): size, mtime_ns, inode."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def open_repo(path: str | os.PathLike[str]) -> Repo | None:
    """The DVC repo holding `path` (the nearest directory above it with a `.dvc/`), else None — found without
    importing DVC, so files outside any DVC repo cost nothing."""
    here = Path(os.path.abspath(path))
    root = next((d for d in here.parents if (d / ".dvc").is_dir()), None)
    if root is None:
        return None
    try:
        from dvc.repo import Repo

        return Repo(str(root), uninitialized=False)
    except Exception:  # DVC cannot open it (or is not installed): callers fall back to hashing themselves
        return None


def state_get(path: str | os.PathLike[str]) -> str | None:
    """The MD5 DVC recorded for the file as it is now, else None."""
    return state_md5s([path]).get(str(path))


def state_md5s(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """The MD5 DVC recorded for each file of `paths` as it is now (by `str(path)`; those DVC knows), one repo open
    for all (of the repo holding the first)."""
    todo = [str(path) for path in paths]
    repo = open_repo(todo[0]) if todo else None
    if repo is None:
        return {}
    try:
        found = {}
        for path in todo:
            _meta, hash_info = repo.state.get(os.path.abspath(path), repo.fs)
            if hash_info is not None and hash_info.name == "md5":
                found[path] = str(hash_info.value)
        return found
    finally:
        repo.close()


def state_put(entries: Iterable[tuple[str | os.PathLike[str], str, dict[str, int]]]) -> int:
    """Save (path, md5, stat_key when the MD5 was computed) in DVC's state, one repo open for all; an entry whose
    file changed since (another stat_key) is skipped: DVC then hashes it itself. Returns the entries saved."""
    todo = list(entries)
    repo = open_repo(todo[0][0]) if todo else None
    if repo is None:
        return 0
    try:
        from dvc_data.hashfile.hash_info import HashInfo

        saved = 0
        for path, md5, key in todo:
            if os.path.exists(path) and stat_key(path) == key:
                repo.state.save(os.path.abspath(path), repo.fs, HashInfo("md5", md5))
                saved += 1
        return saved
    finally:
        repo.close()


def cached_objects(path: str | os.PathLike[str], md5s: Iterable[str]) -> dict[str, Path]:
    """The files of the DVC cache (of the repo holding `path`) that hold each of `md5s`, for those it has."""
    wanted = sorted(set(md5s))
    repo = open_repo(path) if wanted else None
    if repo is None:
        return {}
    try:
        cache = repo.cache.local
        found = {md5: Path(cache.oid_to_path(md5)) for md5 in wanted if MD5.fullmatch(md5)}
        return {md5: p for md5, p in found.items() if p.is_file()}
    except Exception:  # no local cache configured: nothing to link from
        return {}
    finally:
        repo.close()

"""Local archive sources (a path or a `file://` URL; relative paths against the project): checked before the
download stage touches anything, then referenced from paths.raw — hard-linked on the same filesystem, else
symlinked, never copied (a 138 GB archive)."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from tasks.acquire.remote import kind
from tasks.common import PipelineError, atomic_path
from tasks.common.params import resolve_path


def local_path(source: str, root: Path = Path(".")) -> Path:
    """The file a local source names (a `file://` URL or a path; relative paths against `root`, the project)."""
    parts = urlsplit(source)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    return resolve_path(root, source)


def check_local_sources(sources: dict[str, str], root: Path = Path("."), one_archive: bool = False) -> None:
    """Fail before touching anything when local sources are missing, naming all of them at once (`one_archive`:
    archive21k mode's download.archive)."""
    paths = [local_path(s, root) for s in sources.values() if kind(s) == "local"]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing and one_archive:
        raise PipelineError(
            f"expected the archive of per-class tars (params.yaml download.archive) at {missing[0]}, found no such "
            "file. Set download.archive to its file name under download.source, or to its full path or URL."
        )
    if missing:
        raise PipelineError(
            f"expected the ILSVRC2012 archives at {', '.join(missing)}, found no such file"
            f"{'s' if len(missing) > 1 else ''}. Set download.source in params.yaml to the "
            "directory holding the three official archives (or download.train / val / devkit "
            "to each file)."
        )


def link_local(source: str, dest: Path, root: Path = Path(".")) -> str:
    """Reference a local archive from dest: hard link (same filesystem) else symlink. Never copies."""
    src = local_path(source, root)
    if not src.is_file():
        raise PipelineError(
            f"{src}: expected the archive {dest.name} here, found "
            f"{'a directory' if src.is_dir() else 'nothing'}. Set download.source to the "
            "directory holding the three official archives (or the per-archive path) in params.yaml."
        )
    if _same_file(dest, src):  # already in place: nothing touched, so DVC and verify see the same file
        return "symlink" if dest.is_symlink() else "hardlink"
    with atomic_path(dest) as tmp:
        try:
            os.link(src, tmp)
            how = "hardlink"
        except OSError:  # another filesystem (EXDEV) or links not allowed: reference it instead
            os.symlink(src.resolve(), tmp)
            how = "symlink"
    return how


def _same_file(dest: Path, src: Path) -> bool:
    try:
        return dest.exists() and os.path.samefile(dest, src)
    except OSError:
        return False

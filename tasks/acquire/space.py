"""What the download stage still has to bring, and whether it fits: the bytes still to fetch per network archive
(an unchanged complete download, or what a `.part` already holds, does not count), checked against the free space
of paths.raw before anything is written (less SPACE_MARGIN, which archive21k's decompression keeps free too). Part of
the acquire core: nothing here knows an extract mode (the stage adds a .tar.gz's .tar: tasks.acquire.download)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks.acquire.fetch import part_path
from tasks.acquire.md5state import cached_md5
from tasks.acquire.remote import FetchOptions, kind, redact, remote_size
from tasks.common import PipelineError

GB = 1e9
SPACE_MARGIN = 64 << 20  # keep a little room for everything else on the disk


def check_free_space(raw_dir: Path, needed: dict[str, int]) -> None:
    """Fail before writing anything when the archives to fetch (and a .tar.gz's .tar) do not fit on raw_dir's disk."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    total = sum(needed.values())
    free = shutil.disk_usage(raw_dir).free
    if total + SPACE_MARGIN > free:
        raise PipelineError(
            f"{raw_dir}: writing {', '.join(sorted(needed))} needs {total / GB:.2f} GB free (+ "
            f"{SPACE_MARGIN >> 20} MiB margin), found {free / GB:.2f} GB free. Free some space or point "
            "paths.raw at a larger disk (the full ILSVRC2012: ~147 GB of archives, about as much again for "
            "Parquet — make sure there are 300 GB free)."
        )


def unchanged_download(dest: Path, source: str, cache_file: Path) -> str | None:
    """The MD5 of an earlier complete download of the same source, when dest is still those bytes."""
    if not dest.is_file() or part_path(dest).exists():
        return None
    md5, origin = cached_md5(dest, cache_file)
    return md5 if origin == download_origin(source) else None


def download_origin(source: str) -> str:
    """How md5state records an MD5 computed while downloading `source`."""
    return f"download {redact(source)}"


def bytes_to_fetch(sources: dict[str, str], raw_dir: Path, opts: FetchOptions, cache_file: Path) -> dict[str, int]:
    """Bytes still to write per network archive (what is already in `.part` or complete does not count)."""
    needed: dict[str, int] = {}
    for name, source in sources.items():
        if kind(source) in ("sample", "local") or unchanged_download(raw_dir / name, source, cache_file):
            continue
        part = part_path(raw_dir / name)
        needed[name] = max(0, (remote_size(source, opts) or 0) - (part.stat().st_size if part.exists() else 0))
    return needed

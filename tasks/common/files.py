"""Atomic outputs and deterministic JSON: nothing is ever seen half-written under its final name."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `final` only if the block succeeds.

    A reader (or DVC) never sees a half-written file or directory under the final name."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def dumps_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, fixed indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write deterministic JSON."""
    return write_text(path, dumps_json(obj))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Atomically write a UTF-8 text file."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


class UnfitFile(ValueError):
    """A file that is not a small regular text file; `str(err)` says what was found instead."""


def read_small_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`, or UnfitFile; a device, FIFO or larger file is
    refused before (or without) reading it whole (`/dev/zero` as a table would never end). FileNotFoundError and
    other OSErrors pass through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise UnfitFile(f"{kind}, not a regular file")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnfitFile(f"a file larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnfitFile(f"bytes that are not UTF-8 text ({err.reason} at byte {err.start})") from None

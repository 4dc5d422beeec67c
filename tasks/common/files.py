"""Atomic outputs and deterministic JSON: nothing is ever seen half-written under its final name."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.common.errors import PipelineError
from tasks.common.procs import alive


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str], key: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `final` only if the block succeeds.

    A reader (or DVC) never sees a half-written file or directory under the final name. A directory replaces the
    previous one whole: that one is moved aside first and removed after, so a kill between the two renames leaves
    no `final` (never a mix of two versions) and the next atomic_path of it puts the previous one back
    (`restore_dead_aside`). With `key` (the params.yaml key naming the directory, e.g. `paths.reports`) an
    OSError — a full disk, a read-only one — is one PipelineError line (`disk_errors`); give it only where the
    block does nothing but write."""
    final = Path(final)
    with disk_errors(final.parent, final.name, key) if key else contextlib.nullcontext():
        final.parent.mkdir(parents=True, exist_ok=True)
        restore_dead_aside(final)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        _remove(tmp)
        remove_dead_temporaries(final.parent, glob.escape(final.name))
        try:
            yield tmp
            _publish(tmp, final)
        finally:
            _remove(tmp)


def _publish(tmp: Path, final: Path) -> None:
    """`tmp` renamed onto `final`; a previous directory moved aside first (`.<name>.old-<pid>`), removed after."""
    if not final.is_dir() or final.is_symlink():
        os.replace(tmp, final)
        return
    aside = final.with_name(f".{final.name}.old-{os.getpid()}")
    _remove(aside)
    os.replace(final, aside)
    os.replace(tmp, final)  # killed before this line: no `final`, the previous one aside (restore_dead_aside)
    _remove(aside)


def restore_dead_aside(final: Path) -> None:
    """After a kill between `_publish`'s renames: a dead run's previous directory put back where it left no
    `final` (else removed, a newer one being there). A live run's is never touched."""
    for aside in sorted(final.parent.glob(f".{glob.escape(final.name)}.old-*")):
        pid = aside.name.rsplit("-", 1)[1]
        if not pid.isdigit() or (int(pid) != os.getpid() and alive(int(pid))):
            continue
        if final.exists() or final.is_symlink():
            _remove(aside)
        else:
            os.replace(aside, final)


def remove_dead_temporaries(directory: Path, name: str = "*") -> list[Path]:
    """Remove the temporary files of `atomic_path` (`.<name>.tmp-<pid>`) in `directory` whose process is gone: a
    kill -9 mid-write leaves one (as large as what was written); a live process's (another run's) is never touched."""
    removed = []
    for tmp in sorted(Path(directory).glob(f".{name}.tmp-*")):
        pid = tmp.name.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            _remove(tmp)
            removed.append(tmp)
    return removed


@contextlib.contextmanager
def disk_errors(directory: Path, what: str, key: str, kept: str = "") -> Iterator[None]:
    """An OSError while writing `what` under `directory` (ENOSPC, EROFS, EACCES, ...) as one PipelineError line
    naming the directory, the error and the params.yaml `key` that names it; `kept`: what a rerun keeps."""
    try:
        yield
    except OSError as err:
        found = os.strerror(err.errno) if err.errno else str(err)
        raise PipelineError(
            f"{directory}: expected to write {what} here, found {found} (errno {err.errno}); free some space there "
            f"or make it writable ({key} in params.yaml names it), then run again" + (f" ({kept})" if kept else "")
        ) from None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def dumps_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, fixed indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike[str], obj: Any, key: str | None = None) -> Path:
    """Atomically write deterministic JSON (`key`: as for atomic_path)."""
    return write_text(path, dumps_json(obj), key)


def write_text(path: str | os.PathLike[str], text: str, key: str | None = None) -> Path:
    """Atomically write a UTF-8 text file (`key`: as for atomic_path)."""
    with atomic_path(path, key) as tmp:
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


def read_json_strict(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """The JSON document of a small regular UTF-8 file (`read_small_text`), each key once per object (JSON keeps
    the last of two silently: a merge can leave both) and no NaN or Infinity (no JSON number); ValueError (a
    JSONDecodeError, UnfitFile) or OSError otherwise."""
    return json.loads(read_small_text(path, max_bytes), object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def json_problem(err: Exception) -> str:
    """What `read_json_strict` found instead of a document, in words."""
    if isinstance(err, UnfitFile):
        return str(err)
    if isinstance(err, json.JSONDecodeError):
        return f"no JSON ({err.msg} at line {err.lineno} column {err.colno})"
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"the key {twice[0]!r} twice in one object")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name}, which is no JSON number")

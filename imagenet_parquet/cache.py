"""The local cache of remote shards, shared by every process that reads them (DataLoader workers, ranks on a node).

`<root>/<md5>/<name>` (a shard's `footer`, its row groups `0`, `1`, ..., the kept rows of one `0-<digest>`) is only
ever a complete, checked file: `open_or_fill` writes a temporary file `.<name>.<pid>.<thread>.tmp`, lets the caller
check it, and renames it into place. One process fills a name while the others that want it wait on `<name>.lock`
(`flock`) and then find it cached: a row group wanted by several workers at once is fetched once. Readers get an
open file descriptor, so an eviction by another process (unlink) never pulls a file from under a read. Eviction
keeps the row-group files and the temporary files of live processes within the bound (least recently used first:
mtime, touched on every use), and deletes temporary files left by processes that died. A full disk is one
RemoteError naming the cache."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .dvcconfig import RemoteError

ORPHAN_AGE = 3600.0  # seconds: a temporary file this old is a leftover even if its pid was reused


class Cache:
    """The cache directory `root`, its row-group files kept within `limit` bytes (disk blocks)."""

    def __init__(self, root: Path, limit: int):
        self.root, self.limit = Path(root), int(limit)
        self._evicting = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "limit": self.limit}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._evicting = threading.Lock()

    def open_or_fill(self, obj: str, name: str, fill: Callable[[int], None]) -> int:
        """A read-only descriptor of `<root>/<obj>/<name>`: the cached file, else (one process at a time) a new
        one that `fill(fd)` writes and checks (it raises to leave nothing behind). The caller closes it."""
        path = self.root / obj / name
        fd = _open_cached(path)
        if fd is not None:
            return fd
        self.writing(lambda: path.parent.mkdir(parents=True, exist_ok=True), path.parent)
        with _locked(path.with_name(f"{name}.lock")):
            fd = _open_cached(path)  # filled by another process while this one waited
            if fd is None:
                fd = self._fill(path, fill)
        if is_piece(name):
            self.evict(keep=path)
        return fd

    def _fill(self, path: Path, fill: Callable[[int], None]) -> int:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = self.writing(lambda: os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), tmp)
        try:
            fill(fd)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd

    def write(self, fd: int, data: bytes, offset: int) -> None:
        """`data` at `offset` of the file being filled (sparse before it)."""
        self.writing(lambda: _pwrite_all(fd, data, offset), self.root)

    def writing(self, call: Callable[[], int | None], where: Path) -> int:
        """`call()`; a full disk (ENOSPC, EDQUOT) becomes one RemoteError that says what to do."""
        try:
            return call() or 0
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise RemoteError(
                f"{self.root}: no space left on the cache's disk (writing {where.name}); free space there, pass a "
                f"cache_gb below the free space (now {self.limit / 1e9:g} GB), or a cache_dir on a larger disk"
            ) from None

    def evict(self, keep: Path) -> None:
        """Delete least-recently-used row-group files until they and the live temporary files fit `limit`
        (never `keep`); delete the temporary files of dead processes."""
        with self._evicting:
            pieces, total = [], 0
            for path, st in _entries(self.root):
                if path.name.endswith(".tmp"):
                    if _orphan(path.name, st.st_mtime):
                        path.unlink(missing_ok=True)
                        continue
                elif path != keep:
                    pieces.append((st.st_mtime, path, st.st_blocks * 512))
                total += st.st_blocks * 512
            for _, path, size in sorted(pieces):
                if total <= self.limit:
                    break
                path.unlink(missing_ok=True)
                total -= size


def is_piece(name: str) -> bool:
    """A row group's file (`<group>`), or the kept rows of one (`<group>-<16 hex digits>`: remote.py's sparse
    pieces): what eviction may delete."""
    group, _, rows = name.partition("-")
    return group.isdigit() and (not rows or (len(rows) == 16 and all(c in "0123456789abcdef" for c in rows)))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _open_cached(path: Path) -> int | None:
    """A descriptor of `path`, touched (LRU); None when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    os.utime(fd)
    return fd


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (an empty file, kept: removing it would let two processes lock twice)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _entries(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """(path, stat) of every row-group and temporary file in the cache (skipping what vanishes meanwhile)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as shards:
        for shard in shards:
            if not shard.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError), os.scandir(shard.path) as entries:
                for entry in entries:
                    if is_piece(entry.name) or entry.name.endswith(".tmp"):
                        with contextlib.suppress(FileNotFoundError):
                            yield Path(entry.path), entry.stat()


def _orphan(name: str, mtime: float) -> bool:
    """A temporary file whose writer is gone (its pid, the second field of `.<name>.<pid>.<thread>.tmp`)."""
    if time.time() - mtime > ORPHAN_AGE:
        return True
    try:
        os.kill(int(name.split(".")[2]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return True
    except PermissionError:  # alive, another user's
        return False
    return False

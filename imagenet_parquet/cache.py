"""The local cache of remote shards, one per node: shared by every process that reads them (DataLoader workers, the
ranks of a node), bounded at every moment, its files only ever complete and checked.

`<root>/<md5>/<name>` (a shard's `footer`, its row groups `0`, `1`, ..., the kept rows of one `0-<digest>`) is only
ever a complete, checked file: `open_or_fill` writes a temporary file `.<name>.<pid>.<thread>.tmp`, lets the caller
check it, and renames it into place. One process fills a name while the others that want it wait on `<name>.lock`
(`flock`) and then find it cached: a row group wanted by several processes at once is fetched once. Readers get an
open file descriptor, so an eviction by another process (unlink) never pulls a file from under a read.

The bound (`limit`, bytes of disk blocks) holds at every moment, not only after a fill: every write into the cache
first takes its room (`_room`, under `<root>/.usage.lock`, across processes) from a ledger of the bytes in use
(`<root>/.usage`), evicting row-group files when the ledger would pass the limit — the ledger only ever
overcounts (a write is counted before it is made, a retry twice), and it is set to the truth by a scan of the cache
whenever it would pass the limit. Eviction order: with an `EvictionPlan` (the iterable dataset's: where this node
reads each row group this epoch), files of other versions first, then those this node will not read again this
epoch (least recently used first), then those it reads latest; without one, least recently used first (mtime,
touched on every use). When even an empty cache of row groups leaves no room (a limit below what the node's
processes fetch at once), the piece is filled in anonymous memory instead (`memfd`) — checked as ever, read once,
never on disk — so the epoch completes within the bound. Temporary files of dead processes are deleted. A full
disk is one RemoteError naming the cache. Every lock wait is bounded (`LOCK_WAIT`: a lock never let go is one
RemoteError naming it), and a forked child (a DataLoader worker) lets go of the locks its parent's threads held at
the fork, which it would otherwise keep taken for its whole life."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dvcconfig import RemoteError
from .fetch import Final

ORPHAN_AGE = 3600.0  # seconds: a temporary file this old is a leftover even if its pid was reused
SLACK = 8192  # a write's room: its bytes plus the partial blocks at both ends of a sparse write
LEDGER, LEDGER_LOCK = ".usage", ".usage.lock"
RESCAN_AGE = 30.0  # seconds: a ledger not written for this long is set to the truth by a scan before it is used
LOCK_WAIT = 600.0  # seconds: the longest one waits for another process's fill or eviction (each fetch is bounded)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}


def parse_size(value: str | int | float, what: str = "cache_limit") -> int:
    """Bytes of `value`: an int, or a string such as "200GB", "1.5 TB", "500MiB" (KB/MB/GB/TB decimal, KiB/MiB/
    GiB/TiB binary); a ValueError naming `what` otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"{what}: expected a size such as 200GB, 1.5TB or 500MiB (or bytes), found {value!r}")
        unit = match.group(2).lower()
        scale = _UNITS[unit[:1]] if "i" not in unit else 1024 ** "bkmgtp".index(unit[0])
        number = float(match.group(1)) * scale
    if not number > 0:
        raise ValueError(f"{what}: expected a size > 0, found {value!r}")
    return int(number)


class NoRoom(Final):
    """A write that does not fit the cache's limit even with every row group evicted (filled in memory instead)."""


@dataclass
class EvictionPlan:
    """Where this node reads each row group this epoch, as one process of it knows: `first[u]` / `last[u]`, the
    first and last index of the node's reads of unit u (-1: none), units of file f from `file_units[f]`; `files`:
    shard md5 -> file; `cursor`: the node read this process is at (ranks of a node move in step)."""

    files: dict[str, int]
    file_units: np.ndarray
    first: np.ndarray
    last: np.ndarray
    cursor: int = 0

    @classmethod
    def of_reads(cls, md5s: list[str], file_units: np.ndarray, units: np.ndarray, num_units: int) -> EvictionPlan:
        """The plan of a node that reads row groups `units` in this order (file f's groups are units from
        `file_units[f]`; `md5s[f]`, its object)."""
        at = np.arange(len(units), dtype=np.int64)
        first, last = np.full(num_units, len(units), np.int64), np.full(num_units, -1, np.int64)
        np.minimum.at(first, units, at)
        np.maximum.at(last, units, at)
        first[last < 0] = -1
        return cls({md5: f for f, md5 in enumerate(md5s)}, np.asarray(file_units, dtype=np.int64), first, last)

    def peak(self, sizes: np.ndarray) -> int:
        """The most bytes of row groups (`sizes[u]` each) the node holds at once if it keeps each from its first
        read to its last: what its cache must hold for every group to be fetched once."""
        read = np.flatnonzero(self.last >= 0)
        if not len(read):
            return 0
        events = np.zeros(int(self.last.max()) + 2, dtype=np.int64)
        np.add.at(events, self.first[read], sizes[read])
        np.add.at(events, self.last[read] + 1, -sizes[read])
        return int(np.cumsum(events).max())

    def key(self, obj: str, name: str, mtime: float) -> tuple[int, float]:
        """Sort key of a row-group file (lowest evicted first): another version's, then one not read again this
        epoch (oldest first), then the one read latest."""
        file = self.files.get(obj)
        if file is None:
            return (0, mtime)
        unit = int(self.file_units[file]) + int(name.partition("-")[0])
        end = int(self.file_units[file + 1]) if file + 1 < len(self.file_units) else len(self.first)
        if unit >= end or self.last[unit] < self.cursor:
            return (1, mtime)
        return (2, -float(max(int(self.first[unit]), self.cursor)))


class Cache:
    """The cache directory `root`, everything in it kept within `limit` bytes (disk blocks)."""

    def __init__(self, root: Path, limit: int):
        self.root, self.limit = Path(root), int(limit)
        self._reset()

    def _reset(self) -> None:
        self._evicting = threading.Lock()
        self._memory: set[int] = set()  # descriptors of pieces filled in memory (no room on disk)
        self._scanned = False  # this process has set the ledger to the truth once (what others left is counted)
        self.plan: EvictionPlan | None = None  # per process: set by the iterable dataset for its pass
        self._paths: dict[tuple[str, str], str] = {}
        _CACHES.add(self)  # its eviction mutex is renewed in a forked child (_after_fork_in_child)

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "limit": self.limit}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()

    def open_or_fill(
        self, obj: str, name: str, fill: Callable[[int], None], size: Callable[[], int] | None = None
    ) -> int:
        """A read-only descriptor of `<root>/<obj>/<name>`: the cached file, else (one process at a time) a new
        one that `fill(fd)` writes (through `write`) and checks (it raises to leave nothing behind); `size()`: the
        bytes it will write, when known (a piece that cannot fit is then filled in memory at once; asked only when
        it is filled). The caller closes it (`close`)."""
        key = (obj, name)
        cached = self._paths.get(key)
        if cached is None:
            cached = self._paths[key] = os.path.join(self.root, obj, name)  # a str: no Path per read
        fd = _open_cached(cached)
        if fd is not None:
            return fd
        path = Path(cached)
        self.writing(lambda: path.parent.mkdir(parents=True, exist_ok=True), path.parent)
        with _locked(path.with_name(f"{name}.lock")):
            fd = _open_cached(path)  # filled by another process while this one waited
            if fd is None:
                fd = self._fill(path, fill, size)
        return fd

    def _fill(self, path: Path, fill: Callable[[int], None], size: Callable[[], int] | None) -> int:
        if size is not None and is_piece(path.name) and not self._room(size() + SLACK, path, dry=True):
            return self.fill_memory(fill)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = self.writing(lambda: os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), tmp)
        try:
            fill(fd)
            os.rename(tmp, path)
        except NoRoom:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            return self.fill_memory(fill)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd

    def fill_memory(self, fill: Callable[[int], None]) -> int:
        """A descriptor of anonymous memory `fill(fd)` wrote and checked (a piece served once, never cached)."""
        fd = os.memfd_create("imagenet-parquet-piece")
        self._memory.add(fd)
        try:
            fill(fd)
        except BaseException:
            self._memory.discard(fd)
            os.close(fd)
            raise
        return fd

    def close(self, fd: int) -> None:
        """Close a descriptor `open_or_fill` returned."""
        self._memory.discard(fd)
        os.close(fd)

    def write(self, fd: int, data: bytes, offset: int) -> None:
        """`data` at `offset` of the file being filled (sparse before it), once the cache has room for it: written
        under the ledger's lock, so a scan never misses bytes another process is writing."""
        if fd in self._memory:
            return _pwrite_all(fd, data, offset)
        if not self._room(len(data) + SLACK, None, lambda: _pwrite_all(fd, data, offset)):
            raise NoRoom(f"{self.root}: {len(data)} bytes do not fit the cache's limit ({self.limit} bytes)")
        return None

    def writing(self, call: Callable[[], int | None], where: Path) -> int:
        """`call()`; a full disk (ENOSPC, EDQUOT) becomes one RemoteError that says what to do."""
        try:
            return call() or 0
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise RemoteError(
                f"{self.root}: no space left on the cache's disk (writing {where.name}); free space there, pass a "
                f"cache_limit (or cache_gb) below the free space (now {self.limit / 1e9:g} GB), or a cache_dir on a "
                "larger disk"
            ) from None

    def _room(self, need: int, keep: Path | None, then: Callable[[], None] | None = None, dry: bool = False) -> bool:
        """Take `need` bytes of room in the ledger (evicting row-group files other than `keep` when they do not
        fit) and run `then()` (the write) before anyone else may scan; False when even an empty cache of row
        groups leaves no room. `dry`: only whether it could."""
        with self._evicting, _locked(self.root / LEDGER_LOCK):
            used = _read_ledger(self.root, self._scanned)
            if used is None or used + need > self.limit:
                used = self._evict(need, keep, dry)
                self._scanned = True
            if used + need > self.limit:
                return False
            if not dry:
                self.writing(lambda: _write_ledger(self.root, used + need), self.root)
                if then is not None:
                    self.writing(then, self.root)
            return True

    def _evict(self, need: int, keep: Path | None, dry: bool) -> int:
        """The bytes in use (a scan), less the row-group files deleted to make room for `need` (none if `dry`);
        temporary files of dead processes are deleted. Under the ledger's lock."""
        pieces, total, evictable = [], 0, 0
        for path, st in _entries(self.root):
            if path.name.endswith(".tmp") and _orphan(path.name, st.st_mtime):
                path.unlink(missing_ok=True)
                continue
            size = st.st_blocks * 512
            total += size
            if is_piece(path.name) and path != keep:
                pieces.append((self._key(path, st.st_mtime), path, size))
                evictable += size
        if dry:
            return total - evictable if total + need > self.limit else total
        for _, path, size in sorted(pieces, key=lambda p: p[0]):
            if total + need <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
        return total

    def _key(self, path: Path, mtime: float) -> tuple[int, float]:
        return (1, mtime) if self.plan is None else self.plan.key(path.parent.name, path.name, mtime)

    def usage(self) -> int:
        """Bytes of disk blocks the cache's files hold now: a scan under the ledger's lock, which every write and
        eviction takes, so it sees one moment (a scan without it can count a file evicted and the next one written
        meanwhile)."""
        if not self.root.is_dir():
            return 0
        with _locked(self.root / LEDGER_LOCK):
            return sum(st.st_blocks * 512 for _, st in _entries(self.root))


def is_piece(name: str) -> bool:
    """A row group's file (`<group>`), or the kept rows of one (`<group>-<16 hex digits>`: remote.py's sparse
    pieces): what eviction may delete."""
    group, _, rows = name.partition("-")
    return group.isdigit() and (not rows or (len(rows) == 16 and all(c in "0123456789abcdef" for c in rows)))


def _read_ledger(root: Path, scanned: bool) -> int | None:
    """The bytes in use as the ledger counts them; None (scan) when there is none, when it is older than
    RESCAN_AGE (what changed the cache without it counts again), or before this process's first scan."""
    try:
        with open(root / LEDGER, "rb") as fh:
            if not scanned or time.time() - os.fstat(fh.fileno()).st_mtime > RESCAN_AGE:
                return None
            text = fh.read(32)
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _write_ledger(root: Path, used: int) -> None:
    fd = os.open(root / LEDGER, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        text = str(used).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _open_cached(path: str | Path) -> int | None:
    """A descriptor of `path`, touched (LRU); None when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    os.utime(fd)
    return fd


@contextlib.contextmanager
def _locked(path: Path, wait: float = LOCK_WAIT) -> Iterator[None]:
    """An exclusive flock on `path` (an empty file, kept: removing it would let two processes lock twice), waited
    for at most `wait` seconds: a holder that never lets go is one RemoteError naming the lock, never a hang."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline, delay = time.monotonic() + wait, 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RemoteError(
                        f"{path}: still locked after {wait:g} s by another reader of this cache (a fill or an "
                        "eviction that does not end); look for a stuck reader process of this node (`fuser` on the "
                        "lock file) and end it, or give this process its own cache_dir"
                    ) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.01)
        _HELD.add(fd)
        yield
    finally:
        _HELD.discard(fd)
        os.close(fd)


_HELD: set[int] = set()  # lock descriptors this process holds now
_CACHES: weakref.WeakSet[Cache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) starts with copies of what its parent's other threads held at the fork:
    the flock descriptors (the lock would stay taken until the child exits) and each cache's eviction mutex (held
    by a thread the child does not have). It lets go of both."""
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    for cache in list(_CACHES):
        cache._evicting = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _entries(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """(path, stat) of every file of every shard directory in the cache, each once (a file renamed into place
    during the scan is seen under one of its names: one inode), skipping what vanishes meanwhile."""
    seen: set[int] = set()
    for path, st in _walk(root):
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            yield path, st


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as shards:
        for shard in shards:
            if not shard.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError), os.scandir(shard.path) as entries:
                for entry in entries:
                    with contextlib.suppress(FileNotFoundError):
                        if entry.is_file(follow_symlinks=False):
                            yield Path(entry.path), entry.stat(follow_symlinks=False)


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

"""One sequential read of an archive that both MD5s every byte and indexes its tar headers (verify + extract).

tarfile walks an uncompressed tar by reading each 512-byte header and seeking over the member's data. Here it
reads through `SequentialView`: a file object whose reads are served from blocks that a reader thread reads in
file order, once, MD5-ing each block as it goes (hashlib and read() release the GIL, so the hash and the disk run
beside the tar walk on the main thread). A seek over member data only drops blocks. So the official checksum and
the extract stage's index cost one pass over the archive instead of two (a read for the MD5, then the header
walk whose kernel read-ahead pulls most of the file from disk again).

The index is kept as a "prescan" under `<paths.work>/prescan/` (`save_prescan`): the extract stage uses it only
when it is of the very file it indexes (same size, mtime_ns, inode) *and* of the bytes verify accepted (the MD5
in verify.json), so a wrong MD5 still fails verify before any output is published, and a tar that the walk
refuses leaves no prescan: the extract stage walks it again and fails with today's message."""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.common.dvc_state import stat_key
from tasks.common.errors import PipelineError
from tasks.common.files import atomic_path, write_json
from tasks.common.progress import Progress
from tasks.common.tarindex import Entry, index_archive

BLOCK = 8 << 20  # bytes per sequential read
DEPTH = 4  # blocks read ahead of the tar walk (memory: (DEPTH + 2) x BLOCK)
SCANNER = 2  # bump when the index a prescan holds would change (tarindex's rules)
PRESCAN_SCHEMA = pa.schema(
    [("wnid", pa.string()), ("name", pa.string()), ("member", pa.string()), ("offset", pa.int64()),
     ("size", pa.int64())]
)  # fmt: skip


class BlockView(io.RawIOBase):
    """A read-only file object over bytes that arrive once, in order, in blocks (`feed`; None ends them, an
    exception is raised to the reader): tarfile reads it as a file.

    Reads and seeks may go anywhere: a position inside the last two blocks is served from memory, one further
    ahead waits for the blocks up to it (dropping those in between), one further back is read again through
    `reread` (tarfile does not do that on a well-formed archive; without `reread` it is an OSError)."""

    def __init__(self, size: int, bar: Progress | None = None, reread: Any = None) -> None:
        super().__init__()
        self.size, self._bar, self._reread = size, bar, reread
        self._blocks: queue.Queue[bytes | BaseException | None] = queue.Queue(DEPTH)
        self._stop = threading.Event()
        self._prev, self._cur, self._start, self._pos, self._eof = b"", b"", 0, 0, False

    def feed(self, item: bytes | BaseException | None) -> None:
        """Hand over the next block (waits while DEPTH blocks are pending; returns at once once closed)."""
        while not self._stop.is_set():
            try:
                self._blocks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _advance(self) -> bool:
        """The next block becomes current; False at the end of the bytes."""
        item = self._blocks.get()
        if isinstance(item, BaseException):
            self._eof = True
            raise item
        if item is None:
            self._eof = True
            return False
        self._start += len(self._prev)
        self._prev, self._cur = self._cur, item
        if self._bar is not None:
            self._bar.update(len(item))
        return True

    def _slice(self, pos: int, n: int) -> bytes:
        while pos + n > self._start + len(self._prev) + len(self._cur) and not self._eof and self._advance():
            pass
        rel = pos - self._start
        if rel < 0:  # behind the window: read again (never on a well-formed tar)
            if self._reread is None:
                raise OSError(f"read of {n} bytes at {pos}: already streamed past")
            data: bytes = self._reread(pos, n)
            return data
        prev = len(self._prev)
        if rel + n <= prev:
            return self._prev[rel : rel + n]
        if rel < prev:  # across the two blocks
            return self._prev[rel:] + self._cur[: rel + n - prev]
        return self._cur[rel - prev : rel - prev + n]

    def read(self, size: int | None = -1) -> bytes:
        n = self.size - self._pos if size is None or size < 0 else size
        data = self._slice(self._pos, max(0, min(n, self.size - self._pos)))
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def drain(self) -> None:
        """Take the blocks the tar walk did not need (the end-of-archive padding, everything after a refused
        member), so the one feeding them never waits."""
        while not self._eof:
            try:
                if not self._advance():
                    return
            except Exception:
                return

    def close(self) -> None:
        self._stop.set()
        super().close()


class SequentialView(BlockView):
    """A BlockView over the file `path`, read once in order by a reader thread that MD5s every block."""

    def __init__(self, path: str | os.PathLike[str], bar: Progress | None = None, block: int = BLOCK) -> None:
        fd = os.open(path, os.O_RDONLY)
        super().__init__(os.fstat(fd).st_size, bar, lambda pos, n: os.pread(fd, n, pos))
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._fd, self._md5, self._block = fd, hashlib.md5(), block
        self._reader = threading.Thread(target=self._read_ahead, name="archive-pass-reader", daemon=True)
        self._reader.start()

    def _read_ahead(self) -> None:
        """Reader thread: each block in file order, hashed, handed to the tar walk (an error is handed on too)."""
        try:
            while not self._stop.is_set():
                block = os.read(self._fd, self._block)
                if not block:
                    break
                self._md5.update(block)
                self.feed(block)
            self.feed(None)
        except BaseException as err:  # re-raised on the main thread by _advance
            self.feed(err)

    def finish(self) -> str:
        """Hash what the tar walk did not reach and return the file's MD5."""
        while not self._eof and self._advance():
            pass
        return self._md5.hexdigest()

    def close(self) -> None:
        if not self.closed:
            self._stop.set()
            self._reader.join()
            os.close(self._fd)
        super().close()


@dataclass
class ArchivePass:
    """What one pass over an archive found: its MD5, and (when the tar walk succeeded) its index."""

    md5: str
    entries: list[Entry] | None = None
    reported: list[dict[str, str]] = field(default_factory=list)
    refused: str | None = None  # the tar walk's PipelineError (the extract stage reports it again)


def hash_and_index(path: str | os.PathLike[str], split: str, source: str, progress: bool = True) -> ArchivePass:
    """MD5 the archive of `split` (train: nested per-class tars, val: flat) and index it, in one read.

    A tar the walk refuses is still hashed to the end: its MD5 decides first (verify's message and quarantine),
    the refusal is the extract stage's to report."""
    size = os.path.getsize(path)
    bar = Progress(size, f"md5 + tar index {Path(path).name}", enabled=progress)
    with bar, SequentialView(path, bar) as view:
        found = _walk(path, split, source, view)
        found.md5 = view.finish()
    return found


def _walk(path: str | os.PathLike[str], split: str, source: str, view: BlockView) -> ArchivePass:
    """The tar walk over `view` (the MD5 is the caller's to fill in); a refused member is recorded, not raised."""
    try:
        entries, reported = index_archive(path, split, source, fileobj=view, size=view.size)  # type: ignore[arg-type]
    except PipelineError as err:
        return ArchivePass("", refused=str(err))
    return ArchivePass("", entries, reported)


def entries_table(entries: list[Entry]) -> pa.Table:
    """The index's entries as a PRESCAN_SCHEMA table (the prescan's file; the extract stage's staging index)."""
    columns = {name: [getattr(e, name) for e in entries] for name in PRESCAN_SCHEMA.names}
    return pa.Table.from_pydict(columns, schema=PRESCAN_SCHEMA)


class StreamIndex:
    """The tar index of an archive made while its bytes stream in (a download): `feed` every block in file order
    (from byte 0), then `result(md5)`; `abort()` when the stream restarts. The walk runs on its own thread over a
    BlockView; a stream that breaks off or restarts gives no index (the extract stage walks the file instead)."""

    def __init__(self, split: str, name: str | os.PathLike[str], size: int) -> None:
        self._view = BlockView(size)
        self._found: ArchivePass | None = None
        self._thread = threading.Thread(target=self._walk, args=(split, name), name="stream-index", daemon=True)
        self._thread.start()

    def _walk(self, split: str, name: str | os.PathLike[str]) -> None:
        try:
            self._found = _walk(name, split, "", self._view)
        except Exception:  # the stream broke off, restarted, or was not the size announced
            self._found = None
        finally:
            self._view.drain()

    def feed(self, block: bytes) -> None:
        self._view.feed(block)

    def abort(self) -> None:
        self._view.feed(OSError("the stream restarted from byte 0"))
        self._thread.join()
        self._found = None

    def result(self, md5: str, size: int) -> ArchivePass | None:
        """The index (with the stream's `md5`) once every block was fed; None when `size` bytes are not the size
        the walk was told, or the walk could not finish."""
        self._view.feed(None)
        self._thread.join()
        if self._found is None or size != self._view.size:
            return None
        self._found.md5 = md5
        return self._found


def prescan_paths(prescan_dir: Path, split: str) -> tuple[Path, Path]:
    return prescan_dir / f"{split}.parquet", prescan_dir / f"{split}.json"


def save_prescan(prescan_dir: Path, split: str, archive: Path, found: ArchivePass, key: dict[str, int]) -> None:
    """Keep the index of `archive` (as it was when read: `key`, its stat before the pass) for the extract stage;
    an earlier prescan of the split goes first, and none is kept when the walk refused the tar."""
    table_path, meta_path = prescan_paths(prescan_dir, split)
    meta_path.unlink(missing_ok=True)  # the record goes first: a table without one is never used
    if found.entries is None or stat_key(archive) != key:
        return
    with atomic_path(table_path) as tmp:
        pq.write_table(entries_table(found.entries), tmp)
    meta = {"archive": os.path.abspath(archive), "md5": found.md5, "stat": key, "scanner": SCANNER}
    write_json(meta_path, {**meta, "reported": found.reported})


def load_prescan(prescan_dir: Path, split: str, archive: Path, md5: str | None) -> tuple[pa.Table, list[Any]] | None:
    """(index table, reported files) of `archive` when a prescan is of this very file and of the bytes whose MD5
    verify accepted (`md5`, from verify.json), else None (the caller walks the tar itself)."""
    table_path, meta_path = prescan_paths(prescan_dir, split)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        fresh = meta["archive"] == os.path.abspath(archive) and meta["stat"] == stat_key(archive)
        if not (md5 and fresh and meta["md5"] == md5 and meta["scanner"] == SCANNER):
            return None
        return pq.read_table(table_path, schema=PRESCAN_SCHEMA), list(meta["reported"])
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None

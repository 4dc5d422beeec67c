"""Shards read straight from a DVC remote: footers and row groups by range requests, a bounded local cache.

`RemoteShards` is picklable (DataLoader workers rebuild their fsspec filesystem after a fork or spawn). The cache
(`cache_dir`, one directory per shard md5) holds:
  * `<md5>/footer`: the shard's Parquet footer (small; kept, so a second start reads no footer remotely);
  * `<md5>/<group>`: a sparse file as long as the shard's row group `group` ends, holding that row group's bytes
    at their own offsets — so pyarrow (with the footer passed in) and the footer's byte index read it as if it
    were the shard, and disk use is the row group's bytes only.
Row-group files are evicted least-recently-used first (mtime, touched on every use) once they exceed
`cache_bytes` in all; every process writes under a temporary name and renames, so concurrent workers never see a
half-written piece. Each process fetches only the row groups it reads: its own rank's and worker's."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .dvcremote import Remote, RemoteError, find_remote, list_shards, lock_out
from .format import decode_image_index, read_indexed
from .shards import row_group_span

TAIL_BYTES = 1 << 19  # first guess at the footer size: label maps + byte index, ~360 KiB for a 1000-class 256 MB shard
FETCH_THREADS = 16
T = TypeVar("T")


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imagenet-parquet"


def open_dvc(
    repo: Path,
    path: str,
    rev: str | None,
    remote: str | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_gb: float,
) -> RemoteShards:
    """The RemoteShards of DVC-tracked `path` in checkout `repo` (see ParquetIterableDataset.from_dvc)."""
    out, md5 = lock_out(repo, path, rev)
    where = find_remote(repo, rev, remote)
    entries = list_shards(where, where.filesystem(), out, md5, path)
    return RemoteShards(where, entries, Path(cache_dir) if cache_dir else default_cache_dir(), int(cache_gb * 1e9))


class RemoteShards:
    """The shard files [(name, md5)] of one version in `remote`, read by range requests through `cache_dir`."""

    _fs: Any

    def __init__(self, remote: Remote, entries: Sequence[tuple[str, str]], cache_dir: Path, cache_bytes: int):
        if not entries:
            raise RemoteError(f"{remote.url}: expected *.parquet shards in the listing, found none")
        if cache_bytes <= 0:
            raise ValueError(f"cache_gb: expected > 0, found {cache_bytes / 1e9}")
        self.remote, self.entries = remote, list(entries)
        self.cache_dir, self.cache_bytes = Path(cache_dir), int(cache_bytes)
        self._reset()

    def _reset(self) -> None:
        self._pid, self._fs = os.getpid(), None
        self._meta: dict[int, pq.FileMetaData] = {}
        self._index: dict[int, np.ndarray | None] = {}  # per file: the footer's byte index, decoded once
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_fs", "_lock", "_pid")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid, self._fs, self._lock = os.getpid(), None, threading.Lock()

    @property
    def names(self) -> list[Path]:
        return [Path(name) for name, _ in self.entries]

    def _filesystem(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            self._pid, self._fs = os.getpid(), self.remote.filesystem()
        return self._fs

    def _url(self, file: int) -> str:
        return self.remote.object_urls(self.entries[file][1])[0]

    def _dir(self, file: int) -> Path:
        return self.cache_dir / self.entries[file][1]

    # ------------------------------------------------------------ footers
    def metadata(self) -> list[pq.FileMetaData]:
        """Every shard's footer: from the cache, else fetched (in parallel, a range request or two each)."""
        with ThreadPoolExecutor(FETCH_THREADS) as pool:
            return list(pool.map(self.footer, range(len(self.entries))))

    def footer(self, file: int) -> pq.FileMetaData:
        meta = self._meta.get(file)
        if meta is None:
            path = self._dir(file) / "footer"
            data = path.read_bytes() if path.is_file() else self._fetch_footer(file, path)
            meta = self._meta[file] = pq.read_metadata(pa.BufferReader(data))
        return meta

    def _fetch_footer(self, file: int, path: Path) -> bytes:
        fs, url = self._filesystem(), self._url(file)
        try:
            size = int(fs.size(url))
            tail = bytes(fs.cat_file(url, start=max(0, size - TAIL_BYTES), end=size))
            length = int.from_bytes(tail[-8:-4], "little")
            if tail[-4:] != b"PAR1" or length + 12 > size:
                raise RemoteError(
                    f"{url}: expected a Parquet file (ends with PAR1), found other bytes; "
                    "the remote holds something else under this md5 — run `dvc push` again"
                )
            if length + 8 > len(tail):
                tail = bytes(fs.cat_file(url, start=size - length - 8, end=size))
        except FileNotFoundError:
            raise RemoteError(
                f"{url}: expected shard {self.entries[file][0]} in the remote, found none; "
                "run `dvc push` in the project"
            ) from None
        data = b"PAR1" + tail[-(length + 8) :]
        _write_atomic(path, data)
        return data

    # ------------------------------------------------------------ row groups
    def piece(self, file: int, group: int) -> Path:
        """The local sparse file holding row group `group` of `file`, fetched (one range request) if needed."""
        path = self._dir(file) / str(group)
        try:
            os.utime(path)  # LRU: touched on use
            return path
        except FileNotFoundError:
            pass
        first, end = row_group_span(self.footer(file), group)
        data = bytes(self._filesystem().cat_file(self._url(file), start=first, end=end))
        if len(data) != end - first:
            raise RemoteError(
                f"{self._url(file)}: expected {end - first} bytes at {first}, found {len(data)}; "
                "the remote object is shorter than its footer says — run `dvc push` again"
            )
        _write_atomic(path, data, offset=first)
        self._evict(keep=path)
        return path

    def _open(self, file: int, group: int, opener: Callable[[Path], T]) -> T:
        """`opener(piece)`, fetching the piece again if another process evicted it in between."""
        try:
            return opener(self.piece(file, group))
        except FileNotFoundError:
            return opener(self.piece(file, group))

    def read_row_group(self, file: int, group: int, columns: Sequence[str]) -> pa.Table:
        meta = self.footer(file)
        with self._open(file, group, lambda path: pq.ParquetFile(path, metadata=meta)) as pf:
            return pf.read_row_group(group, columns=list(columns), use_threads=False)

    def read_image(self, file: int, group: int, row: int) -> bytes | None:
        """Image `row` of `file` (in row group `group`) through the footer's byte index (map-style), the row group
        fetched into the cache first; None for a shard without the index (the caller reads the row group)."""
        index = self._byte_index(file)
        if index is None:
            return None
        fd = self._open(file, group, lambda path: os.open(path, os.O_RDONLY))
        try:
            return read_indexed(fd, index[row], self.entries[file][0])
        finally:
            os.close(fd)

    def _byte_index(self, file: int) -> np.ndarray | None:
        if file not in self._index:
            meta = self.footer(file)
            self._index[file] = decode_image_index(meta.metadata, meta.num_rows, self.entries[file][0])
        return self._index[file]

    def read_columns(self, file: int, columns: Sequence[str]) -> pa.Table:
        """Small `columns` (e.g. `label`) of the whole of `file`, straight from the remote: only their column
        chunks are requested (uncached reads: a range request each), never the image bytes of the row groups."""
        with self._filesystem().open(self._url(file), "rb", cache_type="none") as fh:
            return pq.ParquetFile(fh, metadata=self.footer(file)).read(columns=list(columns), use_threads=False)

    def _evict(self, keep: Path) -> None:
        """Delete least-recently-used row-group files until all of them fit `cache_bytes` (never `keep`)."""
        with self._lock:
            pieces = []
            for shard in sorted(os.scandir(self.cache_dir), key=lambda e: e.name):
                if shard.is_dir():
                    for entry in os.scandir(shard.path):
                        if entry.name.isdigit():
                            st = entry.stat()
                            pieces.append((st.st_mtime, entry.path, st.st_blocks * 512))
            total = sum(size for _, _, size in pieces)
            for _, path, size in sorted(pieces):
                if total <= self.cache_bytes:
                    break
                if path != str(keep):
                    Path(path).unlink(missing_ok=True)
                    total -= size


def _write_atomic(path: Path, data: bytes, offset: int = 0) -> None:
    """Write `data` at `offset` of a new file (sparse before it) under a temporary name, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.seek(offset)
        fh.write(data)
    os.replace(tmp, path)

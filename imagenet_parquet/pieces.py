"""Reading and checking the cached pieces of one remote shard (a piece: a sparse file holding one row group's
bytes at the shard's own offsets, see remote.py).

Opening a `pq.ParquetFile` costs the footer's Arrow schema every time (~5 ms for a 1000-class shard: more than
hashing a row group's images), so `Pieces` opens one per shard and process, over `Bound`, a file object that
reads whichever piece's descriptor is bound at the moment (under a lock). `verify_row_group` is the check every
fetched row group passes before it enters the cache: each image (hashed in the fetched bytes, no copy) against the
row group's `sha256` column."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .fetch import Corrupt
from .format import HASH_ALGORITHM, plain_value
from .shards import row_group_span

VERIFY_COLUMNS = ["image.bytes", HASH_ALGORITHM]


class Bound:
    """A read-only, seekable file over descriptor `fd` (set by the caller), `size` bytes long."""

    closed = False

    def __init__(self, size: int):
        self.fd, self.pos, self.size = -1, 0, size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (offset, self.pos + offset, self.size + offset)[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        data = os.pread(self.fd, self.size - self.pos if size < 0 else size, self.pos)
        self.pos += len(data)
        return data

    def close(self) -> None:
        pass


class Pieces:
    """The pieces of one shard (footer `meta`, byte index `index`), read through one ParquetFile."""

    def __init__(self, meta: pq.FileMetaData, index: np.ndarray | None, name: str):
        self.meta, self.index, self.name = meta, index, name
        end = max((row_group_span(meta, g)[1] for g in range(meta.num_row_groups)), default=0)
        self._source, self._lock = Bound(end), threading.Lock()
        self._file = pq.ParquetFile(self._source, metadata=meta)

    @contextlib.contextmanager
    def _bound(self, fd: int) -> Iterator[pq.ParquetFile]:
        with self._lock:
            self._source.fd = fd
            try:
                yield self._file
            finally:
                self._source.fd = -1

    def read_row_group(self, fd: int, group: int, columns: Sequence[str]) -> pa.Table:
        with self._bound(fd) as pf:
            return pf.read_row_group(group, columns=list(columns), use_threads=False)

    def verify(self, fd: int, group: int, data: bytes, first: int) -> None:
        """Corrupt unless row group `group` of the piece open at `fd` (its bytes `data`, from offset `first`, just
        written there) holds the images its sha256 column says."""
        with self._bound(fd) as pf:
            verify_row_group(pf, memoryview(data), first, group, self.index, self.name)


def column_span(meta: pq.FileMetaData, group: int, name: str) -> tuple[int, int]:
    """(first, end) byte offsets of column `name`'s chunk (dictionary page included) in row group `group`."""
    rg = meta.row_group(group)
    col = next(rg.column(c) for c in range(rg.num_columns) if rg.column(c).path_in_schema == name)
    start = col.data_page_offset
    if col.has_dictionary_page and col.dictionary_page_offset is not None:
        start = min(start, col.dictionary_page_offset)
    return start, start + col.total_compressed_size


def coalesce(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """(first, end) byte ranges sorted and merged where they touch or lie at most `gap` bytes apart."""
    merged: list[tuple[int, int]] = []
    for first, end in sorted(ranges):
        if merged and first <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return merged


def verify_row_group(
    pf: pq.ParquetFile, view: memoryview, base: int, group: int, index: np.ndarray | None, name: str
) -> None:
    """Corrupt unless every image of row group `group` of `pf` matches its sha256 (`view`: the row group's bytes,
    from file offset `base`). With the footer's byte index, the images are the slices of `view` it points at
    (their length prefixes checked: what map-style reads and what the row group's PLAIN values hold) and only
    the small sha256 column is parsed; without it, the image column is parsed. No copy: it costs the hashing."""
    columns = [HASH_ALGORITHM] if index is not None else VERIFY_COLUMNS
    try:
        table = pf.read_row_group(group, columns, use_threads=False)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise Corrupt(f"expected row group {group}, found bytes that do not parse ({err})") from None
    hashes = table.column(HASH_ALGORITHM).to_pylist()
    images: Iterator[Any]
    if index is not None:
        first = sum(pf.metadata.row_group(g).num_rows for g in range(group))
        images = (_plain(view, offset - base, size) for offset, size in index[first : first + len(hashes)].tolist())
    else:
        images = (value.as_buffer() for value in table.column("image").combine_chunks().field("bytes"))
    for row, (data, digest) in enumerate(zip(images, hashes, strict=True)):
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            raise Corrupt(f"image {row} of row group {group} of {name} does not match its {HASH_ALGORITHM}")


def verify_rows(pieces: Pieces, fd: int, group: int, rows: Sequence[int]) -> None:
    """Corrupt unless each of file rows `rows` (in row group `group`) of the sparse piece open at `fd` — their
    image values and the group's sha256 chunk fetched there — holds the image its sha256 says (byte index)."""
    assert pieces.index is not None
    with pieces._bound(fd) as pf:
        try:
            hashes = pf.read_row_group(group, [HASH_ALGORITHM], use_threads=False).column(0).to_pylist()
        except (OSError, ValueError, pa.ArrowException) as err:
            found = f"other bytes ({err})"
            raise Corrupt(f"expected the {HASH_ALGORITHM} chunk of row group {group}, found {found}") from None
    first = sum(pieces.meta.row_group(g).num_rows for g in range(group))
    for row in rows:
        offset, size = (int(v) for v in pieces.index[row])
        data = plain_value(os.pread(fd, size + 4, offset - 4), size)
        if data is None or hashlib.sha256(data).hexdigest() != hashes[row - first]:
            raise Corrupt(f"image {row} of {pieces.name} does not match its {HASH_ALGORITHM}")


def _plain(view: memoryview, offset: int, size: int) -> memoryview | None:
    """The `size`-byte image value at `offset` of `view`, when its 4-byte length prefix agrees."""
    if offset < 4 or offset + size > len(view) or int.from_bytes(view[offset - 4 : offset], "little") != size:
        return None
    return view[offset : offset + size]

"""The shard writer: streams rows into a Parquet file one row group at a time, locating each image value as it is
written (the footer byte index of format.py) and hashing the file (MD5, for DVC) in the same pass, with fixed
settings so the bytes are deterministic. One writer for every shard this project writes: the convert stage and
compaction (through tasks/common/shard_writer.py, which adds the pipeline's atomic publish and errors) and the
reader's `python -m imagenet_parquet.materialize` — the same settings, the same bytes."""

from __future__ import annotations

import functools
import hashlib
import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import (
    IMAGE_INDEX_KEY,
    SMALL_COLUMNS,
    UNCOMPRESSED_COLUMNS,
    FormatError,
    encode_image_index,
    footer_metadata,
)


class WriteError(FormatError):
    """Rows the writer cannot write as the format wants them; `param`: the setting to change, when one is."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


ZSTD_LEVEL = 3
ROW_GROUP_MAX_BYTES = 128 << 20  # bounds a worker's memory even for a row group of unusually large images
DICTIONARY_COLUMNS = ["wnid", "label_name", "source_format", "transform"]


@dataclass
class ShardWriter:
    """Streams row groups of `row_group_rows` rows (fewer only when their images pass ROW_GROUP_MAX_BYTES, and for
    the last one) into `path`; write it under atomic_path."""

    path: Path
    schema: pa.Schema
    row_group_rows: int
    md5: str = field(default="", init=False)  # of the whole file, once written (handed to DVC: no second hash)

    def write(self, rows: Iterator[dict[str, Any]]) -> int:
        """Consume `rows` (dicts in schema order), holding at most one row group in memory; returns the count.

        Each row group's `image.bytes` values are located in the bytes as the writer hands them to the file
        (IndexingSink); their (offset, size) pairs go into the footer under IMAGE_INDEX_KEY, so readers fetch an
        image with one pread."""
        count, pending, size = 0, [], 0
        columns = self.schema.remove_metadata()
        with open(self.path, "wb") as raw:
            sink = IndexingSink(raw, self.path)
            with pq.ParquetWriter(
                pa.PythonFile(sink, mode="w"), columns, memory_pool=memory_pool(), **writer_options()
            ) as writer:
                for row in rows:
                    pending.append(row)
                    size += len(row["image"]["bytes"])
                    if len(pending) == self.row_group_rows or size >= ROW_GROUP_MAX_BYTES:
                        count += self._flush(writer, pending, sink, columns)
                        pending, size = [], 0
                count += self._flush(writer, pending, sink, columns)
                writer.add_key_value_metadata(
                    {**footer_metadata(self.schema), IMAGE_INDEX_KEY: encode_image_index(sink.entries)}
                )
        self.md5 = sink.md5.hexdigest()
        return count

    def _flush(
        self, writer: pq.ParquetWriter, rows: list[dict[str, Any]], sink: IndexingSink, columns: pa.Schema
    ) -> int:
        if rows:  # a shard of 0 rows is still a valid file carrying the schema
            sink.expect([row["image"]["bytes"] for row in rows])
            writer.write_table(to_table(rows, columns), row_group_size=len(rows))
            sink.check()
        return len(rows)


class IndexingSink(io.RawIOBase):
    """The file object the ParquetWriter writes through (pa.PythonFile): each chunk it is handed goes to `raw`,
    into the file's MD5 (the whole file in the same pass: no read back), and is searched for the image values of
    the row group being written (`expect`), which the PLAIN page bodies hold verbatim, in order."""

    def __init__(self, raw: Any, path: Path) -> None:
        super().__init__()
        self.raw, self.path = raw, path
        self.md5 = hashlib.md5()
        self.position = 0  # bytes written so far: the offset of the next chunk in the file
        self.entries: list[tuple[int, int]] = []
        self._values: list[bytes] = []  # the row group being written, values not located yet
        self._next = 0  # the first value of _values not located yet

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def write(self, data: Any) -> int:
        chunk = data if isinstance(data, bytes) else bytes(data)
        self.raw.write(chunk)
        self.md5.update(chunk)
        if self._next < len(self._values):
            found = locate_values(chunk, self.position, self._values[self._next :])
            self.entries += found
            self._next += len(found)
        self.position += len(chunk)
        return len(chunk)

    def expect(self, values: list[bytes]) -> None:
        """The image values of the row group about to be written, in row order."""
        self._values, self._next = values, 0

    def check(self) -> None:
        """Every value of the row group just written was located, or WriteError (never a wrong index)."""
        if self._next < len(self._values):
            raise WriteError(
                f"{self.path}: expected image {self._next} of the row group ({len(self._values[self._next])} "
                "bytes) stored verbatim (PLAIN, uncompressed image.bytes), found it nowhere in the bytes written; "
                "writer_options() must keep image.bytes uncompressed and without dictionary"
            )
        self._values = []


def locate_values(chunk: bytes, base: int, values: list[bytes]) -> list[tuple[int, int]]:
    """(file offset, size) of the first values found in `chunk` (written at file offset `base`), in order; the
    values after one that is not in it (it comes in a later chunk) are left for the next chunks.

    PLAIN, uncompressed binary values appear verbatim as a 4-byte little-endian length then the bytes; each is
    searched forward from the end of the previous hit. A hit is checked byte for byte (`startswith`: no copy), so a
    recorded offset always holds exactly the value."""
    found, pos = [], 0
    for value in values:
        head = struct.pack("<I", len(value)) + value[:64]
        hit = chunk.find(head, pos)
        while hit >= 0 and not chunk.startswith(value, hit + 4):
            hit = chunk.find(head, hit + 1)
        if hit < 0:
            break
        found.append((base + hit + 4, len(value)))
        pos = hit + 4 + len(value)
    return found


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Column by column (~5x faster than Table.from_pylist for rows of large binaries), each column wrapped around
    numpy-built buffers: no pa.array, whose first call imports pandas (~0.2 s of CPU in every worker)."""
    columns = []
    for field_ in schema:
        if pa.types.is_struct(field_.type):
            children = [_array([row[field_.name][sub.name] for row in rows], sub.type) for sub in field_.type]
            columns.append(pa.StructArray.from_arrays(children, fields=list(field_.type)))
        else:
            columns.append(_array([row[field_.name] for row in rows], field_.type))
    return pa.Table.from_arrays(columns, schema=schema)


_NUMPY_TYPES = {pa.int8(): np.int8, pa.int32(): np.int32, pa.int64(): np.int64, pa.uint64(): np.uint64}


def _array(values: list[Any], type_: pa.DataType) -> pa.Array:
    """One column from its Python values (None: null). Binary and string values: one join + offsets (zero-copy
    wrap) instead of pyarrow's growing builder (3x faster); integers: one numpy array."""
    valid = [v is not None for v in values]
    nulls = None if all(valid) else pa.py_buffer(np.packbits(np.array(valid, dtype=bool), bitorder="little"))
    if type_ in _NUMPY_TYPES:  # numpy refuses a value out of the type's range (OverflowError), as pa.array does
        data = np.array([0 if v is None else v for v in values], dtype=_NUMPY_TYPES[type_])
        return pa.Array.from_buffers(type_, len(values), [nulls, pa.py_buffer(data)])
    if type_ not in (pa.binary(), pa.string()):
        raise TypeError(f"no column builder for Arrow type {type_}")
    text = type_ == pa.string()
    blobs = [b"" if v is None else v.encode() if text else v for v in values]  # strict UTF-8, as pa.array
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise WriteError(
            f"expected row groups under 2 GiB of image bytes, found {offsets[-1]} bytes in {len(blobs)} rows; lower "
            "row_group_rows",
            "row_group_rows",
        )
    data = pa.py_buffer(b"".join(blobs))
    return pa.Array.from_buffers(type_, len(blobs), [nulls, pa.py_buffer(offsets.astype(np.int32)), data])


@functools.lru_cache(maxsize=1)
def memory_pool() -> pa.MemoryPool:
    """jemalloc where pyarrow has it: with mimalloc (pyarrow's default) a worker's RSS kept creeping up shard after
    shard (+60 MB over 11 shards) instead of staying flat (docs/notes/issue-4-note.md)."""
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowException):
        return pa.default_memory_pool()


def writer_options() -> dict[str, Any]:
    """Fixed writer settings: identical bytes on every run. JPEG bytes don't compress, so they are stored raw
    (PLAIN, no dictionary: each value verbatim, which the footer byte index relies on);
    statistics only on small columns (min/max of image bytes would be whole images). No `ARROW:schema` (it would
    repeat the schema metadata, the whole class list, base64-encoded): every type reads back as written from the
    Parquet types alone (imagenet_parquet.format), and the metadata is written once, as key-value pairs."""
    compression: dict[str, str] = dict.fromkeys(SMALL_COLUMNS, "zstd")
    compression.update(dict.fromkeys(UNCOMPRESSED_COLUMNS, "none"))
    return {
        "compression": compression,
        "compression_level": dict.fromkeys(SMALL_COLUMNS, ZSTD_LEVEL),
        "use_dictionary": DICTIONARY_COLUMNS,
        "column_encoding": dict.fromkeys(UNCOMPRESSED_COLUMNS, "PLAIN"),  # verbatim: the footer byte index
        "write_statistics": SMALL_COLUMNS,
        "version": "2.6",
        "data_page_version": "1.0",
        "store_schema": False,
    }

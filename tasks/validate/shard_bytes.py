"""One shard's image bytes, read once and checked row by row (`scan_shard`, run in validate's worker processes):
the JPEG SOI marker, SHA-256 against the `sha256` column, a Pillow decode where asked, and the footer's byte index
against the same bytes. `tasks.validate.scan` plans the shards and merges what each one found."""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from imagenet_parquet.format import IMAGE_INDEX_KEY, decode_image_index, plain_value

JPEG_SOI = b"\xff\xd8"


@dataclass
class ByteFindings:
    """Rows failing a byte-level check: combined-frame index → what was found."""

    not_jpeg: dict[int, str] = field(default_factory=dict)
    hash_mismatch: dict[int, str] = field(default_factory=dict)
    undecodable: dict[int, str] = field(default_factory=dict)
    index_mismatch: dict[int, str] = field(default_factory=dict)
    unindexed: list[str] = field(default_factory=list)  # shards without the footer's byte index
    decoded: dict[str, int] = field(default_factory=dict)
    image_bytes: dict[str, int] = field(default_factory=dict)

    def count(self, split: str, data: pa.Buffer | None, decoded: bool) -> None:
        self.image_bytes[split] = self.image_bytes.get(split, 0) + (data.size if data is not None else 0)
        self.decoded[split] = self.decoded.get(split, 0) + int(decoded)

    def merge(self, other: ByteFindings) -> None:
        """Add another shard's findings (rows are global indices: no overlap)."""
        for name in ("not_jpeg", "hash_mismatch", "undecodable", "index_mismatch"):
            getattr(self, name).update(getattr(other, name))
        self.unindexed += other.unindexed
        for split, value in other.decoded.items():
            self.decoded[split] = self.decoded.get(split, 0) + value
        for split, value in other.image_bytes.items():
            self.image_bytes[split] = self.image_bytes.get(split, 0) + value


@dataclass(frozen=True)
class ShardScan:
    """What one worker needs to check one shard's bytes: its rows' recorded sha256, width × height, decode flag."""

    split: str
    path: Path
    first: int
    rows: int
    sha: np.ndarray
    size: np.ndarray
    decode: np.ndarray


def scan_shard(job: ShardScan) -> ByteFindings:
    """One shard, one read: each row group's `image.bytes` column chunk is read once (through `_Recorder`);
    every row is checked for the JPEG SOI marker, SHA-256 against `sha256`, a Pillow decode where `decode` is
    set (to width × height), and the footer's byte index against those same bytes."""
    findings = ByteFindings()
    with open(job.path, "rb") as raw:
        source = _Recorder(raw)
        pf = pq.ParquetFile(source)
        index = _byte_index(job, pf.metadata, findings)
        start = 0
        for group in range(pf.num_row_groups):
            source.blocks.clear()
            blobs = pf.read_row_group(group, columns=["image.bytes"], use_threads=False)
            blobs = blobs.column("image").combine_chunks().field("bytes")
            for offset in range(len(blobs)):
                row = start + offset
                data = blobs[offset].as_buffer() if blobs[offset].is_valid else None
                _check_blob(job.first + row, data, job.sha[row], job.size[row], bool(job.decode[row]), findings)
                if index is not None:
                    _check_indexed(job.first + row, data, source, index[row], findings)
                findings.count(job.split, data, bool(job.decode[row]))
            start += len(blobs)
    return findings


class _Recorder(io.RawIOBase):
    """A read-only file that keeps the blocks it served since `blocks.clear()` (a row group's column chunk):
    the byte-index check then compares against the bytes already read instead of reading them again."""

    def __init__(self, raw: io.BufferedReader) -> None:
        self.raw = raw
        self.blocks: list[tuple[int, bytes]] = []
        self.size = os.fstat(raw.fileno()).st_size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, size: int = -1) -> bytes:
        at = self.raw.tell()
        data = self.raw.read(size)
        self.blocks.append((at, data))
        return data

    def at(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`: from a recorded block when it holds them, else one pread."""
        for start, block in self.blocks:
            if start <= offset and offset + size <= start + len(block):
                return block[offset - start : offset - start + size]
        return os.pread(self.raw.fileno(), size, offset)


def _byte_index(job: ShardScan, footer: pq.FileMetaData, findings: ByteFindings) -> np.ndarray | None:
    """The shard's footer byte index; a wrong entry count marks every row of the shard."""
    try:
        index = decode_image_index(footer.metadata, job.rows, job.path)
    except ValueError as err:
        findings.index_mismatch.update({job.first + r: str(err) for r in range(job.rows)})
        return None
    if index is None:
        findings.unindexed.append(f"{job.split}/{job.path.name}")
    return index


def _check_indexed(
    row: int, data: pa.Buffer | None, source: _Recorder, entry: np.ndarray, findings: ByteFindings
) -> None:
    """The indexed bytes (a PLAIN value: 4-byte little-endian length, then the bytes) must be the row's value."""
    offset, size = int(entry[0]), int(entry[1])
    found = source.at(offset - 4, size + 4) if offset >= 4 and offset + size <= source.size else b""
    value = plain_value(found, size)
    if value is None:
        findings.index_mismatch[row] = (
            f"{IMAGE_INDEX_KEY} points at offset {offset}, where no {size}-byte image value is stored"
        )
        return
    if data is None or not data.equals(pa.py_buffer(value)):
        findings.index_mismatch[row] = (
            f"{IMAGE_INDEX_KEY} offset {offset} holds "
            f"{size} bytes (sha256 {hashlib.sha256(value).hexdigest()[:16]}…) "
            "that differ from the row's image.bytes"
        )


def _check_blob(
    index: int, data: pa.Buffer | None, expected: object, size: np.ndarray, decode: bool, findings: ByteFindings
) -> None:
    view = memoryview(data) if data is not None else memoryview(b"")
    if bytes(view[:2]) != JPEG_SOI:
        findings.not_jpeg[index] = f"starts with {bytes(view[:4]).hex(' ') or 'nothing (no bytes)'}"
    digest = hashlib.sha256(view).hexdigest()
    if digest != expected:
        findings.hash_mismatch[index] = f"sha256 of the bytes is {digest}"
    if decode:
        problem = decode_problem(view, size)
        if problem:
            findings.undecodable[index] = problem


def decode_problem(view: memoryview, size: np.ndarray) -> str | None:
    """None when Pillow fully decodes the bytes to the recorded width × height, else what went wrong."""
    try:
        with Image.open(io.BytesIO(view)) as image:
            image.load()
            found = image.size
    except Exception as err:  # any decoder failure is a finding, reported with its message
        message = re.sub(r" <[^<>]* at 0x[0-9a-fA-F]+>", "", str(err))  # no object address: same report every run
        return f"Pillow cannot decode it: {type(err).__name__}: {message}"
    expected = tuple(int(v) if pd.notna(v) else -1 for v in size)
    if found != expected:
        return f"decodes to {found[0]}x{found[1]}, the row says {expected[0]}x{expected[1]}"
    return None

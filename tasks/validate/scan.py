"""Reading the Parquet shards for validation without ever holding a split's image bytes.

Metadata columns (everything but `image.bytes`) are read selectively into one DataFrame; the image bytes are
streamed row group by row group (`ParquetFile.read_row_group`), so memory is bounded by the largest row group,
never by the number of rows."""

from __future__ import annotations

import contextlib
import hashlib
import io
import multiprocessing
import os
import re
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from imagenet_parquet.format import IMAGE_INDEX_KEY, SMALL_COLUMNS, decode_image_index, plain_value
from tasks.common import SPLITS, PipelineError
from tasks.common.progress import Progress

if TYPE_CHECKING:
    from tasks.validate.scan_cache import ScanCache

JPEG_SOI = b"\xff\xd8"
POOL_MIN_BYTES = 64 << 20  # less than this is checked in-process: a pool's start costs more than it saves


@dataclass(frozen=True)
class Shard:
    """One shard file and where its rows sit in the combined metadata frame."""

    split: str
    path: Path
    first: int  # index of its first row in the combined frame
    rows: int
    footer: pq.FileMetaData = field(compare=False, repr=False)  # read once: the schema check uses it


def list_shards(parquet_dir: str | Path) -> dict[str, list[Path]]:
    """`<parquet_dir>/<split>/*.parquet` per split, sorted; a PipelineError when a split has none."""
    found = {split: sorted((Path(parquet_dir) / split).glob("*.parquet")) for split in SPLITS}
    for split, files in found.items():
        if not files:
            raise PipelineError(
                f"{Path(parquet_dir) / split}: expected Parquet shards `{split}-*.parquet`, found "
                "none; run the convert stage first (`dvc repro convert`)"
            )
    return found


def _read_shard_metadata(path: Path) -> tuple[pd.DataFrame, pq.FileMetaData]:
    """The metadata columns present in one shard (image.path flattened to `image_path`), no image bytes; and its
    footer."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as err:
        raise PipelineError(
            f"{path}: expected a Parquet shard, found an unreadable file ({err}); re-run the "
            "convert stage (`dvc repro convert`)"
        ) from None
    present = set(pf.schema_arrow.names) | {f"image.{f.name}" for f in _image_fields(pf.schema_arrow)}
    table = pf.read(columns=[c for c in SMALL_COLUMNS if c in present], use_threads=False)
    frame = table.drop_columns([c for c in ["image"] if c in table.column_names]).to_pandas()
    if "image.path" in present:
        frame.insert(0, "image_path", table.column("image").combine_chunks().field("path").to_pandas())
    frame["shard"] = path.name
    frame["row"] = np.arange(len(frame), dtype=np.int64)
    return frame, pf.metadata


def _image_fields(schema: pa.Schema) -> list[pa.Field]:
    if "image" not in schema.names or not pa.types.is_struct(schema.field("image").type):
        return []
    return list(schema.field("image").type)


def read_metadata(shards: dict[str, list[Path]]) -> tuple[pd.DataFrame, list[Shard]]:
    """All splits' metadata rows in split → shard → row order (the frame's RangeIndex), and the shard plan."""
    frames, plan, first = [], [], 0
    for split in SPLITS:
        for path in shards[split]:
            frame, footer = _read_shard_metadata(path)
            frame.insert(0, "split", split)
            frames.append(frame)
            plan.append(Shard(split, path, first, len(frame), footer))
            first += len(frame)
    return pd.concat(frames, ignore_index=True), plan


def iter_row_groups(
    path: Path, rows: set[int] | None = None, footer: pq.FileMetaData | None = None
) -> Iterator[tuple[int, pa.BinaryArray]]:
    """(first row of the group in the file, its `image.bytes`) per row group; only groups holding `rows`.
    `footer`: the file's footer when already read (not read again)."""
    pf = pq.ParquetFile(path, metadata=footer)
    start = 0
    for index in range(pf.num_row_groups):
        count = pf.metadata.row_group(index).num_rows
        if rows is None or any(start <= r < start + count for r in rows):
            table = pf.read_row_group(index, columns=["image.bytes"], use_threads=False)
            yield start, table.column("image").combine_chunks().field("bytes")
            del table
        start += count


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


def scan_bytes(
    plan: list[Shard],
    meta: pd.DataFrame,
    decode: np.ndarray,
    workers: int = 1,
    progress: bool = True,
    cache: ScanCache | None = None,
) -> ByteFindings:
    """Every shard's stored bytes, read once, checked by `scan_shard` (in a pool of `workers` processes when
    there is more than one shard); findings merged in shard order, so the result does not depend on `workers`.
    `cache`: a shard whose findings it kept for the shard and inputs as they are now is not read (and one that is
    read has its findings kept there)."""
    jobs = _jobs(plan, meta, decode)
    keys = [cache.key(job) if cache else None for job in jobs]
    parts = [cache.load(job, key) if cache else None for job, key in zip(jobs, keys, strict=True)]
    todo = [job for job, part in zip(jobs, parts, strict=True) if part is None]
    if sum(job.path.stat().st_size for job in todo) < POOL_MIN_BYTES:
        workers = 1
    findings = ByteFindings()
    with Progress(len(meta), "validate", unit="img", enabled=progress) as bar, _pool(min(workers, len(todo))) as pool:
        scanned = pool.map(scan_shard, todo)
        for job, key, part in zip(jobs, keys, parts, strict=True):
            if part is None:
                part = next(scanned)
                if cache:
                    cache.store(job, key, part)
            findings.merge(part)
            bar.update(job.rows)
    if cache:
        cache.prune(jobs)
    return findings


def _jobs(plan: list[Shard], meta: pd.DataFrame, decode: np.ndarray) -> list[ShardScan]:
    """One ShardScan per shard: its rows' recorded sha256, width × height and decode flag."""
    sha = meta["sha256"].to_numpy() if "sha256" in meta else np.full(len(meta), None)
    size = meta.reindex(columns=["width", "height"]).to_numpy()
    return [
        ShardScan(s.split, s.path, s.first, s.rows, *(a[s.first : s.first + s.rows] for a in (sha, size, decode)))
        for s in plan
    ]


@contextlib.contextmanager
def _pool(workers: int) -> Iterator[Executor]:
    """A process pool of `workers` (forkserver, scan preloaded), or this process when one is enough."""
    if workers <= 1:
        with ThreadPoolExecutor(max_workers=1) as inline:
            yield inline
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool


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

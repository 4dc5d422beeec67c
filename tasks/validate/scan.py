"""Reading the Parquet shards for validation without ever holding a split's image bytes.

Metadata columns (everything but `image.bytes`) are read selectively into one DataFrame; the image bytes are
streamed row group by row group (`ParquetFile.read_row_group`), so memory is bounded by the largest row group,
never by the number of rows."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from imagenet_parquet.format import IMAGE_INDEX_KEY, SMALL_COLUMNS, decode_image_index, read_indexed
from tasks.common import SPLITS, PipelineError

JPEG_SOI = b"\xff\xd8"


@dataclass(frozen=True)
class Shard:
    """One shard file and where its rows sit in the combined metadata frame."""

    split: str
    path: Path
    first: int  # index of its first row in the combined frame
    rows: int
    footer: pq.FileMetaData = field(compare=False, repr=False)  # read once; the schema and byte index come from it


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


def scan_bytes(plan: list[Shard], meta: pd.DataFrame, decode: np.ndarray) -> ByteFindings:
    """Stream every row's stored bytes once: JPEG SOI marker, SHA-256 against `sha256`, Pillow decode of the
    rows where `decode` is true (the decoded size must equal width × height), and the footer's byte index
    (the bytes one pread at the indexed offset returns must equal `image.bytes`)."""
    findings = ByteFindings()
    sha = meta["sha256"].to_numpy() if "sha256" in meta else np.full(len(meta), None)
    size = meta.reindex(columns=["width", "height"]).to_numpy()
    for shard in plan:
        fd = os.open(shard.path, os.O_RDONLY)
        try:
            index = _byte_index(shard, findings)
            for start, blobs in iter_row_groups(shard.path, footer=shard.footer):
                for offset in range(len(blobs)):
                    row = shard.first + start + offset
                    data = blobs[offset].as_buffer() if blobs[offset].is_valid else None
                    _check_blob(row, data, sha[row], size[row], bool(decode[row]), findings)
                    if index is not None:
                        _check_indexed(row, data, fd, index[start + offset], shard.path, findings)
                    findings.image_bytes[shard.split] = findings.image_bytes.get(shard.split, 0) + (
                        data.size if data is not None else 0
                    )
                    findings.decoded[shard.split] = findings.decoded.get(shard.split, 0) + int(decode[row])
        finally:
            os.close(fd)
    return findings


def _byte_index(shard: Shard, findings: ByteFindings) -> np.ndarray | None:
    """The shard's footer byte index; a wrong entry count marks every row of the shard."""
    try:
        index = decode_image_index(shard.footer.metadata, shard.rows, shard.path)
    except ValueError as err:
        findings.index_mismatch.update({shard.first + r: str(err) for r in range(shard.rows)})
        return None
    if index is None:
        findings.unindexed.append(f"{shard.split}/{shard.path.name}")
    return index


def _check_indexed(
    row: int, data: pa.Buffer | None, fd: int, entry: np.ndarray, path: Path, findings: ByteFindings
) -> None:
    try:
        found = read_indexed(fd, entry, path)
    except ValueError:
        findings.index_mismatch[row] = (
            f"{IMAGE_INDEX_KEY} points at offset {int(entry[0])}, where no {int(entry[1])}-byte image value is stored"
        )
        return
    if data is None or not data.equals(pa.py_buffer(found)):
        findings.index_mismatch[row] = (
            f"{IMAGE_INDEX_KEY} offset {int(entry[0])} holds "
            f"{int(entry[1])} bytes (sha256 {hashlib.sha256(found).hexdigest()[:16]}…) "
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
        return f"Pillow cannot decode it: {type(err).__name__}: {err}"
    expected = tuple(int(v) if pd.notna(v) else -1 for v in size)
    if found != expected:
        return f"decodes to {found[0]}x{found[1]}, the row says {expected[0]}x{expected[1]}"
    return None


def decode_mask(meta: pd.DataFrame, sample: int | float | str, seed: int = 0) -> np.ndarray:
    """Deterministic per-split sample of rows to decode: a count, a fraction in (0, 1], or "all"."""
    mask = np.zeros(len(meta), dtype=bool)
    for split in SPLITS:
        rows = np.flatnonzero((meta["split"] == split).to_numpy())
        count = sample_size(len(rows), sample)
        picked = np.random.default_rng(seed).choice(len(rows), size=count, replace=False)
        mask[rows[picked]] = True
    return mask


def sample_size(rows: int, sample: int | float | str) -> int:
    """How many of `rows` to decode for the `decode_sample` param (checked by tasks.common.params)."""
    if sample == "all":
        return rows
    if isinstance(sample, float):
        return min(rows, int(np.ceil(sample * rows)))
    return min(rows, int(sample))

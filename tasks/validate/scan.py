"""Reading the Parquet shards for validation without ever holding a split's image bytes, each shard's bytes read
once, and what that read found kept between runs.

Metadata columns (everything but `image.bytes`) are read selectively into one DataFrame; the image bytes are
streamed row group by row group (`ParquetFile.read_row_group`), so memory is bounded by the largest row group,
never by the number of rows.

One shard's image bytes are read once and checked row by row (`scan_shard`, run in validate's worker processes):
the JPEG SOI marker, SHA-256 against the `sha256` column, a Pillow decode where asked, and the footer's byte index
against the same bytes. `scan_bytes` plans the shards and merges what each one found.

Each shard's byte findings are kept between validate runs (`ScanCache`), so that a curation-only change reads no
image byte. What `scan_shard` finds depends only on the shard's bytes and on what the metadata frame expects of its
rows, so each shard's findings (rows as offsets within the shard) are kept in scratch space,
`<paths.work>/validate/scan/<split>/<shard>.json` (not a DVC output), under a key:

* the shard as it is on disk: name, size, mtime_ns and inode (the trust the download stage's MD5 reuse gives a
  file, tasks.acquire.md5state) and the SHA-256 of its footer;
* the inputs of the check for its rows: a digest of the sha256 and width × height the metadata frame gives them
  and of their decode flags; the scanner's version and Pillow's (its messages are in the report).

Any difference — or a cache file that is missing, unreadable or malformed — and the shard is scanned again. The
findings are the same as a full scan's, so the report is byte-identical whichever shards came from here.

The decode sample (`decode_mask`) is drawn so that curation moves it little: excluding a row outside it changes
nothing, excluding a sampled row brings in one other — only the shards of those rows are scanned again."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import PIL
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from imagenet_parquet.format import IMAGE_INDEX_KEY, SMALL_COLUMNS, decode_image_index, plain_value
from tasks.common import SPLITS, PipelineError, write_json
from tasks.common.files import UnfitFile, read_small_text
from tasks.common.progress import Progress
from tasks.validate.kept_metadata import KeptMetadata, shard_identity

POOL_MIN_BYTES = 64 << 20  # less than this is checked in-process: a pool's start costs more than it saves


# ---------------------------------------------------------------- the shards and their metadata
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


def _read_shard_metadata(path: Path, footer: pq.FileMetaData | None = None) -> tuple[pa.Table, pq.FileMetaData]:
    """The metadata columns present in one shard (image.path flattened to `image_path`), no image bytes; and its
    footer (`footer`: already parsed)."""
    try:
        pf = pq.ParquetFile(path, metadata=footer)
    except (OSError, pa.ArrowException) as err:
        raise PipelineError(
            f"{path}: expected a Parquet shard, found an unreadable file ({err}); re-run the "
            "convert stage (`dvc repro convert`)"
        ) from None
    present = set(pf.schema_arrow.names) | {f"image.{f.name}" for f in _image_fields(pf.schema_arrow)}
    table = pf.read(columns=[c for c in SMALL_COLUMNS if c in present], use_threads=False)
    if "image" in table.column_names:
        names = table.column("image").combine_chunks().field("path") if "image.path" in present else None
        table = table.drop_columns(["image"])
        if names is not None:
            table = table.add_column(0, "image_path", names)
    return table, pf.metadata


def _image_fields(schema: pa.Schema) -> list[pa.Field]:
    if "image" not in schema.names or not pa.types.is_struct(schema.field("image").type):
        return []
    return list(schema.field("image").type)


def read_metadata(shards: dict[str, list[Path]], kept: KeptMetadata | None = None) -> tuple[pd.DataFrame, list[Shard]]:
    """All splits' metadata rows in split → shard → row order (the frame's RangeIndex), and the shard plan. The
    shards' columns are joined in Arrow and converted once (a shard without a column has nulls there). `kept`:
    each unchanged shard's table from validate's scratch space (tasks/validate/kept_metadata.py)."""
    kept = kept or KeptMetadata(None)
    tables, plan, first = [], [], 0
    for split in SPLITS:
        for path in shards[split]:
            table, footer = kept.read(split, path, _read_shard_metadata)
            tables.append(table)
            plan.append(Shard(split, path, first, table.num_rows, footer))
            first += table.num_rows
    try:
        frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):  # types that do not unify: as they are
        frame = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
    counts = [s.rows for s in plan]
    frame.insert(0, "split", np.repeat(np.array([s.split for s in plan], dtype=object), counts))
    frame["shard"] = np.repeat(np.array([s.path.name for s in plan], dtype=object), counts)
    frame["row"] = np.concatenate([np.arange(n, dtype=np.int64) for n in counts] or [np.zeros(0, np.int64)])
    return frame, plan


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


# ---------------------------------------------------------------- one shard's bytes, read once (in a worker)
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


# ---------------------------------------------------------------- every shard's bytes
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


# ---------------------------------------------------------------- the findings kept between runs, and the decode sample
SCANNER_VERSION = 1  # bump when scan_shard's checks or messages change: every kept finding is then rescanned
SCAN_DIR = "scan"  # under the validate work directory
ROW_FINDINGS = ("not_jpeg", "hash_mismatch", "undecodable", "index_mismatch")
MAX_BYTES = 256 << 20  # a cache file larger than this is not one this module wrote for a shard


class ScanCache:
    """The kept findings under `directory` (`<paths.work>/validate/scan`)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def file(self, job: ShardScan) -> Path:
        return self.directory / job.split / f"{job.path.name}.json"

    def key(self, job: ShardScan) -> dict[str, Any] | None:
        """What the findings of `job` depend on, read before its bytes are; None when the shard cannot be keyed
        (it is then scanned, and what is wrong with it reported by the scan)."""
        identity = shard_identity(job.path)
        if identity is None:
            return None
        return {
            "scanner": SCANNER_VERSION,
            "pillow": PIL.__version__,
            "split": job.split,
            **identity,
            "rows": job.rows,
            "inputs_sha256": inputs_digest(job),
        }

    def load(self, job: ShardScan, key: dict[str, Any] | None) -> ByteFindings | None:
        """The kept findings of `job` (rows of the combined frame), or None: no file, another key, not readable."""
        if key is None:
            return None
        try:
            doc = json.loads(read_small_text(self.file(job), MAX_BYTES))
        except (OSError, UnfitFile, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key:
            return None
        part = parse_findings(doc.get("findings"), job.rows)
        return shifted(part, job.first) if part is not None else None

    def store(self, job: ShardScan, key: dict[str, Any] | None, found: ByteFindings) -> None:
        """Keep `found` (rows of the combined frame) for `job` under the `key` read before its scan."""
        if key is not None:
            findings = as_json(shifted(found, -job.first))
            write_json(self.file(job), {"key": key, "findings": findings}, key="paths.work")

    def prune(self, jobs: list[ShardScan]) -> None:
        """Remove the kept findings of shards no longer listed (a new conversion's names)."""
        kept = {self.file(job) for job in jobs}
        for path in sorted(self.directory.glob("*/*.json")):
            if path not in kept:
                path.unlink(missing_ok=True)


def inputs_digest(job: ShardScan) -> str:
    """SHA-256 of what the metadata frame expects of the shard's rows: sha256, width × height, decode flag."""
    digest = hashlib.sha256()
    digest.update(json.dumps(np.asarray(job.sha).tolist()).encode())
    digest.update(b"\0" + _array_bytes(np.asarray(job.size)))
    digest.update(b"\0" + np.asarray(job.decode, dtype=bool).tobytes())
    return digest.hexdigest()


def _array_bytes(values: np.ndarray) -> bytes:
    """A numeric array as its dtype, shape and buffer (a list of 1.3 M Python ints cost ~1 s at 1.33 M rows);
    anything else as the repr of its values."""
    if values.dtype.kind in "biuf":
        return f"{values.dtype.str}{values.shape}".encode() + np.ascontiguousarray(values).tobytes()
    return repr(values.tolist()).encode()


def shifted(found: ByteFindings, delta: int) -> ByteFindings:
    """`found` with every row moved by `delta` (shard offsets ↔ rows of the combined frame), order kept."""
    moved = {name: {row + delta: text for row, text in getattr(found, name).items()} for name in ROW_FINDINGS}
    return ByteFindings(
        **moved, unindexed=list(found.unindexed), decoded=dict(found.decoded), image_bytes=dict(found.image_bytes)
    )


def as_json(found: ByteFindings) -> dict[str, Any]:
    """Findings as JSON: row findings as [row, text] pairs in the order found (the report lists them so)."""
    doc: dict[str, Any] = {name: [[row, text] for row, text in getattr(found, name).items()] for name in ROW_FINDINGS}
    return {**doc, "unindexed": found.unindexed, "decoded": found.decoded, "image_bytes": found.image_bytes}


def parse_findings(doc: object, rows: int) -> ByteFindings | None:
    """`as_json`'s output back (rows within [0, rows)), or None when it is anything else."""
    if not isinstance(doc, dict) or set(doc) != {*ROW_FINDINGS, "unindexed", "decoded", "image_bytes"}:
        return None
    found = ByteFindings()
    for name in ROW_FINDINGS:
        pairs = doc[name]
        if not isinstance(pairs, list) or not all(_row_pair(p, rows) for p in pairs):
            return None
        getattr(found, name).update((row, text) for row, text in pairs)
        if len(getattr(found, name)) != len(pairs):  # a row twice: not what as_json wrote
            return None
    if not isinstance(doc["unindexed"], list) or not all(isinstance(s, str) for s in doc["unindexed"]):
        return None
    found.unindexed = list(doc["unindexed"])
    for name in ("decoded", "image_bytes"):
        counts = doc[name]
        if not isinstance(counts, dict) or not all(_count(v) for v in counts.values()):
            return None
        setattr(found, name, dict(counts))
    return found


def _row_pair(pair: object, rows: int) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and _count(pair[0]) and pair[0] < rows and isinstance(pair[1], str)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def decode_mask(meta: pd.DataFrame, sample: int | float | str, seed: int = 0) -> np.ndarray:
    """Deterministic per-split sample of rows to decode (a count, a fraction in (0, 1], or "all"): the rows with
    the smallest `sample_keys`. Stable under curation: excluding a row outside the sample leaves the sample as it
    is, excluding a sampled row brings in the next one (and only the shards of those rows are scanned again)."""
    mask = np.zeros(len(meta), dtype=bool)
    keys = sample_keys(meta, seed)
    for split in SPLITS:
        rows = np.flatnonzero((meta["split"] == split).to_numpy())
        count = sample_size(len(rows), sample)
        mask[rows[np.argsort(keys[rows], kind="stable")[:count]]] = True
    return mask


def sample_keys(meta: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """A keyed 64-bit hash of each row's (split, shard name, row in the shard), the same whatever other rows the
    frame holds: BLAKE2b of `split/shard` keyed by `seed`, mixed with the row (splitmix64's finalizer)."""
    split_codes, splits = pd.factorize(meta["split"])
    shard_codes, names = pd.factorize(meta["shard"])
    width = max(len(names), 1)
    codes, pairs = pd.factorize(split_codes.astype(np.int64) * width + shard_codes)
    salt = np.array([_keyed(f"{splits[p // width]}/{names[p % width]}", seed) for p in pairs], dtype=np.uint64)
    rows = meta["row"].to_numpy(dtype=np.uint64)
    return _mix(salt[codes] ^ _mix(rows))


def _keyed(text: str, seed: int) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(digest.digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 (wrapping arithmetic): every input bit moves every output bit."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def sample_size(rows: int, sample: int | float | str) -> int:
    """How many of `rows` to decode for the `decode_sample` param (checked by tasks.common.params)."""
    if sample == "all":
        return rows
    if isinstance(sample, float):
        return min(rows, int(np.ceil(sample * rows)))
    return min(rows, int(sample))

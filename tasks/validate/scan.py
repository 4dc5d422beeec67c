"""Reading the Parquet shards for validation without ever holding a split's image bytes.

Metadata columns (everything but `image.bytes`) are read selectively into one DataFrame; the image bytes are
streamed row group by row group (`ParquetFile.read_row_group`), so memory is bounded by the largest row group,
never by the number of rows."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import SMALL_COLUMNS
from tasks.common import SPLITS, PipelineError
from tasks.common.progress import Progress
from tasks.validate import shard_bytes
from tasks.validate.shard_bytes import ByteFindings, ShardScan

if TYPE_CHECKING:
    from tasks.validate.scan_cache import ScanCache

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


def _read_shard_metadata(path: Path) -> tuple[pa.Table, pq.FileMetaData]:
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


def read_metadata(shards: dict[str, list[Path]]) -> tuple[pd.DataFrame, list[Shard]]:
    """All splits' metadata rows in split → shard → row order (the frame's RangeIndex), and the shard plan. The
    shards' columns are joined in Arrow and converted once (a shard without a column has nulls there)."""
    tables, plan, first = [], [], 0
    for split in SPLITS:
        for path in shards[split]:
            table, footer = _read_shard_metadata(path)
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
        scanned = pool.map(shard_bytes.scan_shard, todo)
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
    context.set_forkserver_preload([shard_bytes.__name__])
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool

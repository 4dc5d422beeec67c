"""The extract stage's manifests (docs/CONTRACTS.md): the selected classes' rows, labelled, sorted by class then
name, one zstd Parquet file per split written atomically."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.common import SPLITS, atomic_path
from tasks.common.manifests import MANIFEST_SCHEMA, manifest_path

SORT_KEYS = [(key, "ascending") for key in ("wnid", "name", "source", "member", "offset")]


def _manifest(split: str, table: pa.Table, label_of: dict[str, int]) -> pa.Table:
    inside = pc.is_in(table.column("wnid"), pa.array(sorted(label_of), pa.string()))
    kept = table if pc.all(inside).as_py() is not False else table.filter(inside)  # every class kept: no copy
    kept = kept.sort_by(SORT_KEYS)
    added = {
        "split": pa.repeat(pa.scalar(split, pa.string()), kept.num_rows),
        "label": _labels(kept.column("wnid"), label_of),
    }
    arrays = [added[f.name] if f.name in added else kept.column(f.name) for f in MANIFEST_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=MANIFEST_SCHEMA).combine_chunks()


def _labels(wnids: pa.ChunkedArray, label_of: dict[str, int]) -> pa.Array:
    """Each row's label by its class (every class is in `label_of`), without a Python object per row."""
    keys = sorted(label_of)
    at = pc.index_in(wnids, value_set=pa.array(keys, pa.string()))
    return pc.take(pa.array([label_of[k] for k in keys], pa.int64()), at)


def write_manifest(manifests_dir: Path, split: str, table: pa.Table) -> None:
    with atomic_path(manifest_path(manifests_dir, split)) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def write_manifests(
    manifests_dir: Path, tables: dict[str, pa.Table], label_of: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """Each split's manifest (the selected classes, labelled); returns (rows kept, rows outside the subset)."""
    counts = {}
    for split in SPLITS:
        manifest = _manifest(split, tables[split], label_of)
        write_manifest(manifests_dir, split, manifest)
        counts[split] = (manifest.num_rows, tables[split].num_rows - manifest.num_rows)
    return counts

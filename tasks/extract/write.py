"""The extract stage's manifests (docs/CONTRACTS.md): the selected classes' rows, labelled, sorted by class then
name, one zstd Parquet file per split written atomically."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.common import SPLITS, atomic_path
from tasks.common.manifests import MANIFEST_SCHEMA, manifest_path, one_chunk

ROW_GROUP = 1 << 20  # rows per row group of a manifest (pyarrow's default), and rows sorted out at a time
SORT_KEYS = [(key, "ascending") for key in ("wnid", "name", "source", "member", "offset")]


def _manifest(split: str, table: pa.Table, label_of: dict[str, int]) -> Iterator[pa.Table]:
    """The split's manifest rows (its selected classes, labelled, in SORT_KEYS order), ROW_GROUP rows at a time:
    the sorted manifest is never held whole beside the index it comes from (13 M rows)."""
    inside = pc.is_in(table.column("wnid"), pa.array(sorted(label_of), pa.string()))
    kept = table if pc.all(inside).as_py() is not False else table.filter(inside)  # every class kept: no copy
    del table
    order = pc.sort_indices(_sortable(kept), sort_keys=SORT_KEYS)  # stable: equal keys keep the index's order
    for first in range(0, kept.num_rows, ROW_GROUP):
        rows = order.slice(first, ROW_GROUP)
        arrays = {
            "split": pa.repeat(pa.scalar(split, pa.string()), len(rows)),
            "label": _labels(kept.column("wnid").take(rows), label_of),
        }
        arrays |= {
            name: kept.column(name).take(rows).cast(MANIFEST_SCHEMA.field(name).type) for name in kept.column_names
        }
        yield pa.Table.from_arrays([arrays[f.name] for f in MANIFEST_SCHEMA], schema=MANIFEST_SCHEMA)


def _sortable(table: pa.Table) -> pa.Table:
    """The sort keys, a dictionary column (read so: a class, an archive) as the rank of its value (Arrow sorts no
    dictionary keys): the same order as the strings', without decoding them."""
    keys = {}
    for name, _ in SORT_KEYS:
        column = one_chunk(table.column(name))
        if pa.types.is_dictionary(column.type):
            rank = pc.rank(column.dictionary, sort_keys="ascending", tiebreaker="min").cast(pa.int32())
            column = rank.take(column.indices)
        keys[name] = column
    return pa.table(keys)


def _labels(wnids: pa.ChunkedArray, label_of: dict[str, int]) -> pa.Array:
    """Each row's label by its class (every class is in `label_of`), without a Python object per row."""
    keys = sorted(label_of)
    at = pc.index_in(wnids, value_set=pa.array(keys, pa.string()))
    return pc.take(pa.array([label_of[k] for k in keys], pa.int64()), at)


def write_manifest(manifests_dir: Path, split: str, tables: Iterable[pa.Table]) -> int:
    """Write a split's manifest from its row groups (atomically); return its row count."""
    rows = 0
    with (
        atomic_path(manifest_path(manifests_dir, split)) as tmp,
        pq.ParquetWriter(tmp, MANIFEST_SCHEMA, compression="zstd") as writer,
    ):
        for table in tables:
            writer.write_table(table, row_group_size=ROW_GROUP)
            rows += table.num_rows
    return rows


def write_manifests(
    manifests_dir: Path, tables: dict[str, pa.Table], label_of: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """Each split's manifest (the selected classes, labelled); returns (rows kept, rows outside the subset).
    Takes the tables out of `tables` as it goes (13 M rows: each column is copied once, in order, and let go)."""
    counts = {}
    for split in SPLITS:
        found = tables[split].num_rows
        rows = write_manifest(manifests_dir, split, _manifest(split, tables.pop(split), label_of))  # held once
        counts[split] = (rows, found - rows)
    return counts

"""The shards as a table with the curation overlay applied, for tools other than the PyTorch readers (pandas,
polars, Hugging Face `datasets`): a plain read of the shards gives the labels as converted, and every image.

    from imagenet_parquet.tables import read_curated
    table = read_curated("data/parquet", "train", columns=["label", "wnid", "label_name"])   # pyarrow.Table
    table.to_pandas(); polars.from_arrow(table); datasets.Dataset(table)                     # curated labels

DuckDB joins the overlay itself (`CURATED_SQL`, docs/trainer.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import COLUMNS, label_map_from_metadata
from .overlay import resolve_overlay
from .shards import Source, find_shards

# DuckDB: the rows of a split with the overlay's labels, excluded rows left out ({root}: the Parquet root, {split}).
CURATED_SQL = """
SELECT s.* REPLACE (o.label AS label), o.keep
FROM read_parquet('{root}/{split}/*.parquet', filename = true, file_row_number = true) AS s
JOIN read_parquet('{root}/../overlay/{split}.parquet') AS o
  ON o.shard = parse_filename(s.filename) AND o.row = s.file_row_number
WHERE o.keep
ORDER BY s.filename, s.file_row_number
"""


def read_curated(
    source: Source, split: str | None = None, columns: Sequence[str] | None = None, overlay: Any = "auto"
) -> pa.Table:
    """`columns` (default: all) of every row the overlay keeps, in shard order, with `label` and — when read —
    `wnid` and `label_name` as curated. The overlay is found and checked as the readers do (`overlay` as theirs)."""
    files = find_shards(source, split)
    metas = [pq.read_metadata(f) for f in files]
    label_map = label_map_from_metadata(metas[0].metadata, files[0])
    names = list(columns) if columns is not None else COLUMNS
    rows = [m.num_rows for m in metas]
    found = resolve_overlay(overlay, files, split, rows, label_map["num_classes"], metas[0].metadata)
    table = pa.concat_tables(pq.read_table(f, columns=names) for f in files)
    if found is None:
        return table
    classes = sorted(label_map["classes"], key=lambda c: c["label"])
    take = pa.array(found.labels)
    curated = {
        "label": take,
        "wnid": pa.array([c.get("wnid") for c in classes], pa.string()).take(take),
        "label_name": pa.array([c["name"] for c in classes], pa.string()).take(take),
    }
    for name, values in curated.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), table.schema.field(name), values)
    return table.filter(pa.array(np.asarray(found.keep)))

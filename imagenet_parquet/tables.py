"""The shards as a table with the curation overlay applied, for tools other than the PyTorch readers (pandas,
polars, Hugging Face `datasets`, DuckDB): a plain read of the shards gives the labels as converted, and every image.

    from imagenet_parquet.tables import curated_sql, read_curated
    table = read_curated("data/parquet", "train", columns=["label", "wnid", "label_name"])   # pyarrow.Table
    table.to_pandas(); polars.from_arrow(table); datasets.Dataset(table)                     # curated labels
    duckdb.sql(curated_sql("data/parquet", "train"))                                         # the same rows
    read_curated("data/parquet", "train", view="imagenet100")               # a view's rows, labels 0..K-1

Both check the shards as the readers do first (every footer against the overlay's SHA-256 and row count; a split
read whole must have every shard its overlay lists) and curate every label-derived column: `label`, `wnid` and
`label_name` all come from the overlay's label through the label map."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .format import COLUMNS
from .overlay import Overlay
from .shards import ShardIndex, Source, find_shards, whole_split

# DuckDB: the rows of the shards `{files}` (a list literal) kept by the overlay `{overlay}` (its rows of the shards
# `{names}`), with `label`, `wnid` and `label_name` from the overlay's label through the classes `{classes}` (a
# VALUES list: label, wnid, label_name; an excluded row of a format-2 overlay may have label -1, no class). A row on
# one side only (a shard changed after `curated_sql` checked it) fails the query (`error`) instead of dropping or
# mislabelling rows. Fill it with `curated_sql`, which checks first.
CURATED_SQL = """
SELECT s.* REPLACE (o.label AS label, c.wnid::VARCHAR AS wnid, c.label_name::VARCHAR AS label_name)
FROM read_parquet({files}, filename = true, file_row_number = true) AS s
FULL JOIN (SELECT * FROM read_parquet({overlay}) WHERE shard IN {names}) AS o
  ON o.shard = parse_filename(s.filename) AND o.row = s.file_row_number
LEFT JOIN (VALUES {classes}) AS c(label, wnid, label_name) ON c.label = o.label
WHERE CASE WHEN s.filename IS NULL OR o.shard IS NULL OR (o.keep AND c.label IS NULL) THEN error({changed})
  ELSE o.keep END
ORDER BY s.filename, s.file_row_number
"""


def checked_shards(
    source: Source, split: str | None = None, overlay: Any = "auto", view: str | None = None
) -> tuple[ShardIndex, Overlay | None]:
    """The shards' index (footers read once) and their overlay checked against those footers, as the readers
    check them (`overlay` as theirs: "auto", a path, or False for the labels as converted; `view`: a named view's
    file instead, as theirs)."""
    index = ShardIndex.build(find_shards(source, split))
    found = index.local_overlay(overlay, split, whole_split(source, split), view)
    index.classes_for(found)  # shards of several label maps need a format-2 overlay: refused here as by the readers
    return index, found


def _classes(index: ShardIndex, found: Overlay | None) -> list[dict[str, Any]]:
    """The classes of the curated rows in label order: the overlay's (format 2, a view) or the shards'."""
    return sorted(index.classes_for(found)["classes"], key=lambda c: c["label"])


def read_curated(
    source: Source,
    split: str | None = None,
    columns: Sequence[str] | None = None,
    overlay: Any = "auto",
    view: str | None = None,
) -> pa.Table:
    """`columns` (default: all) of every row the overlay (or view `view`) keeps, in shard order, with `label` and
    — when read — `wnid` and `label_name` as curated. Each shard is read through the file its footer was checked
    in."""
    index, found = checked_shards(source, split, overlay, view)
    names = list(columns) if columns is not None else COLUMNS
    table = pa.concat_tables(index.read_columns(i, names) for i in range(len(index.files)))
    if found is None:
        return table
    classes = _classes(index, found)
    keep = np.asarray(found.keep)
    table = table.filter(pa.array(keep))
    take = pa.array(found.labels[keep])
    curated = {
        "label": take,
        "wnid": pa.array([c.get("wnid") for c in classes], pa.string()).take(take),
        "label_name": pa.array([c["name"] for c in classes], pa.string()).take(take),
    }
    for name, values in curated.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), table.schema.field(name), values)
    return table


def _literal(value: Any) -> str:
    """A DuckDB literal: NULL, an integer, or a quoted string (quotes doubled)."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def curated_sql(source: Source, split: str | None = None, overlay: Any = "auto", view: str | None = None) -> str:
    """The DuckDB query of the curated rows (`CURATED_SQL` filled in) after checking the shards and the overlay
    as the readers do (`checked_shards`): an overlay that is not the shards' is refused here (OverlayError), and a
    shard changed between this check and the query fails the query. Without an overlay (none applies, or
    overlay=False): the shards as converted, pinned by name. `view`: the rows and labels of that view."""
    index, found = checked_shards(source, split, overlay, view)
    files = "[" + ", ".join(_literal(str(f)) for f in index.files) + "]"
    if found is None:
        return f"SELECT * FROM read_parquet({files}, filename = true, file_row_number = true)"
    names = "(" + ", ".join(_literal(f.name) for f in index.files) + ")"
    classes = ", ".join(
        f"({_literal(c['label'])}, {_literal(c.get('wnid'))}, {_literal(c['name'])})" for c in _classes(index, found)
    )
    changed = _literal(
        f"{found.path}: expected the shards it was checked against (curated_sql), found other rows — a shard "
        "changed since; call curated_sql again (after `dvc pull` of the shards and data/overlay together)"
    )
    return CURATED_SQL.format(
        files=files, overlay=_literal(str(Path(found.path))), names=names, classes=classes, changed=changed
    )

"""The manifests (extract -> convert, validate): one row per image, where its bytes lie (docs/CONTRACTS.md)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

MANIFEST_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("label", pa.int64()),
        ("wnid", pa.string()),
        ("name", pa.string()),
        ("source", pa.string()),
        ("member", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
    ]
)


def manifest_path(manifests_dir: str | os.PathLike[str], split: str) -> Path:
    """The manifest of `split` (written by extract)."""
    return Path(manifests_dir) / f"{split}.parquet"


def read_columns(path: str | os.PathLike[str], columns: list[str], dictionary: list[str] | None = None) -> pa.Table:
    """`columns` of a Parquet file read a column at a time, each as one chunk (a take of random rows from a chunked
    column is ~300x slower), `dictionary` ones as dictionaries: the table once plus one column, never a second
    copy of a 13 M-row index (pyarrow's threaded `read_table` holds ~2x the table while it decodes)."""
    file = pq.ParquetFile(path, read_dictionary=dictionary or [])
    return pa.table({name: one_chunk(file.read([name], use_threads=False).column(0)) for name in columns})


def one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its chunk itself when it has one (`combine_chunks` would copy it)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def dictionary_columns(path: str | os.PathLike[str], sample: int = 8192) -> list[str]:
    """The string columns of an index (staging or manifest) worth reading as dictionaries: the class and the
    per-class tar always (19,000 values at most for 13 M rows), the source when it repeats in the first `sample`
    rows (an archive's name: one value; a folder's files: one each)."""
    first = next(pq.ParquetFile(path).iter_batches(sample, columns=["source"], use_threads=False), None)
    repeats = first is not None and pc.count_distinct(first.column(0)).as_py() * 8 <= max(8, first.num_rows)
    return ["wnid", "member", *(["source"] if repeats else [])]


def int64_values(array: pa.Array) -> np.ndarray:
    """An integer or boolean array's value slots as int64, straight from its buffer (not `to_numpy` or
    `fill_null`: they load pandas, ~0.2 s in every process)."""
    values = array.cast(pa.int64())
    if not len(values):
        return np.zeros(0, np.int64)
    return np.frombuffer(values.buffers()[1], np.int64, len(values), values.offset * 8)

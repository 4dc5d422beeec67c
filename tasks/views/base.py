"""What a view is cut from: a split's base overlay (data/overlay/<split>.parquet, format 1 or 2) and its shards'
metadata columns — never an image byte (the kept images' sizes come from the footer's byte index).

The class list is the overlay's `label_map` (format 2) or the shards' (format 1: every shard the same); labels and
the keep flag are the overlay's. Every shard the overlay lists must be there, unchanged (rows, footer digest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imagenet_parquet.format import (
    FormatError,
    class_ids,
    decode_image_index,
    label_map_from_metadata,
    read_label_map,
)
from imagenet_parquet.overlay import LABEL_MAP_FORMAT, footer_digest, footer_tail, overlay_label_map, read_overlay
from tasks.common import PipelineError
from tasks.views.spec import CLASS_COLUMNS, PATH_COLUMN

HELP = "run `dvc repro` (or `dvc pull` the shards and data/overlay of one version together)"


@dataclass
class BaseSplit:
    """A split as curated: the overlay's shard list, labels, keep flags and digest; the class list; per row the
    image's byte size and the metadata columns views need."""

    split: str
    shards: list[tuple[str, int, str]]
    label_map: dict[str, Any]
    labels: np.ndarray
    keep: np.ndarray
    digest: str
    image_bytes: np.ndarray
    columns: dict[str, pa.Array]

    @property
    def ids(self) -> list[str]:
        return class_ids(self.label_map)

    def column(self, name: str) -> pa.Array:
        """A condition's column: read from the shards, or (label, wnid, label_name) the curated class."""
        if name == "label":
            return pa.array(self.labels)
        if name in CLASS_COLUMNS:
            per_class = pa.array([c.get(name if name == "wnid" else "name") for c in self.label_map["classes"]])
            return per_class.take(pa.array(np.maximum(self.labels, 0), mask=self.labels < 0))
        return self.columns[name]


def read_base(parquet: Path, overlay: Path, label_map: Path, split: str, columns: set[str]) -> BaseSplit:
    """The base of `split`: its overlay checked against its shards, and the shards' `columns` (no image bytes)."""
    path = overlay / f"{split}.parquet"
    if not path.is_file():
        raise PipelineError(f"{path}: expected the {split} overlay written by the curate stage, found none; {HELP}")
    meta, table = read_overlay(path)
    shards = [(str(s[0]), int(s[1]), str(s[2])) for s in meta["shards"]]
    read = [c for c in sorted(columns) if c not in CLASS_COLUMNS]
    found, sizes, maps = _read_shards(parquet / split, path, shards, read)
    if meta.get("format") == LABEL_MAP_FORMAT:
        lmap = _carried(meta, path, [*maps, read_label_map(label_map)])
    else:
        lmap = maps[0] if maps else read_label_map(label_map)
        if any(other != lmap for other in maps):
            raise PipelineError(
                f"{parquet / split}: expected one label map in every shard under overlay format 1 ({path}), found "
                f"shards with different ones; {HELP}"
            )
    labels = table.column("label").to_numpy().astype(np.int64)
    keep = table.column("keep").to_numpy(zero_copy_only=False)
    return BaseSplit(split, shards, lmap, labels, keep, str(meta["content_sha256"]), sizes, found)


def _read_shards(
    directory: Path, overlay: Path, shards: list[tuple[str, int, str]], columns: list[str]
) -> tuple[dict[str, pa.Array], np.ndarray, list[dict[str, Any]]]:
    """Each listed shard checked and read: the columns asked for, the image sizes, its label map."""
    pieces: dict[str, list[pa.Array]] = {c: [] for c in columns}
    sizes, maps = [], []
    for name, rows, footer in shards:
        file = directory / name
        if not file.is_file() or footer_digest(footer_tail(file)) != footer:
            state = "no such file" if not file.is_file() else "another file (footer digest differs)"
            raise PipelineError(f"{overlay}: expected shard {file} as it lists it, found {state}; {HELP}")
        pf = pq.ParquetFile(file)
        meta = pf.schema_arrow.metadata
        maps.append(label_map_from_metadata(meta, file))
        sizes.append(_image_sizes(pf, meta, rows, file))
        table = pf.read(columns=[_parquet_column(c) for c in columns], use_threads=False) if columns else None
        for column in columns:
            pieces[column].append(_value(table, column))
    found = {c: pa.concat_arrays(p) if p else pa.array([], pa.string()) for c, p in pieces.items()}
    return found, np.concatenate(sizes) if sizes else np.zeros(0, np.int64), maps


def _parquet_column(column: str) -> str:
    return "image.path" if column == PATH_COLUMN else column


def _value(table: pa.Table | None, column: str) -> pa.Array:
    assert table is not None
    if column == PATH_COLUMN:
        return table.column("image").combine_chunks().field("path")
    return table.column(column).combine_chunks()


def _image_sizes(pf: pq.ParquetFile, meta: dict[bytes, bytes] | None, rows: int, file: Path) -> np.ndarray:
    """Each row's image size in bytes: the footer's byte index (format >= 2; older shards: the column's lengths)."""
    if pf.metadata.num_rows != rows:
        raise PipelineError(
            f"{file}: expected {rows} rows (as its overlay lists), found {pf.metadata.num_rows}; {HELP}"
        )
    try:
        index = decode_image_index(pf.metadata.metadata, rows, file)
    except FormatError as err:
        raise PipelineError(str(err)) from None
    if index is not None:
        return index[:, 1].astype(np.int64)
    lengths = pc.binary_length(pf.read(columns=["image.bytes"]).column("image").combine_chunks().field(0))
    sizes: np.ndarray = lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    return sizes


def _carried(meta: dict[str, Any], overlay: Path, known: list[dict[str, Any]]) -> dict[str, Any]:
    """A format-2 overlay's label map, whole, as every reader takes it (`overlay_label_map`; class names of a map
    stored without them from the shards' and label_map.json's classes of the same wnid)."""
    try:
        found = overlay_label_map(meta, overlay, known)
    except FormatError as err:
        raise PipelineError(f"{err}") from None
    assert found is not None  # format 2
    return found

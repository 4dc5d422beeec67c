"""Rows of shards of several generations (issue 33): the identity of a row across versions and which rows the
current source still holds, shared by the curate and validate stages (docs/CONTRACTS.md, "Appends").

A split's shards may come from several conversions: generation 0 (the canonical layout) and appended generations
1, 2, ... (own metadata `generation`), each with the label map current when it was written. A row's identity is
(class id, name): the class id from its own shard's label map (`class_ids`: the wnid, or the class folder name),
the name its `image.path`. The newest generation of an identity wins (`newest_rows`: an older row was replaced by
a modified image); an identity the current manifest does not list was removed from the source (`in_source`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from imagenet_parquet.format import class_ids, label_map_from_metadata, shard_generation

REMOVED, REPLACED = "removed from source", "replaced by a newer version"  # the overlay's exclusion reasons


@dataclass(frozen=True)
class ShardClasses:
    """A shard's generation and its own label map (and that map's class ids, by label)."""

    generation: int
    label_map: dict[str, Any]
    ids: list[str]


def shard_classes(meta: dict[bytes, bytes] | None, where: Any) -> ShardClasses:
    """The generation and label map a shard's footer metadata records (FormatError when it has no label map)."""
    label_map = label_map_from_metadata(meta, where)
    return ShardClasses(shard_generation(meta), label_map, class_ids(label_map))


def row_ids(labels: np.ndarray, ids: list[str]) -> np.ndarray:
    """The class id of every row (object array) from its stored `labels` and its shard's class ids."""
    table = np.asarray(ids, dtype=object)
    return table[np.asarray(labels, dtype=np.int64)] if len(table) else np.full(len(labels), None, dtype=object)


def current_labels(ids: np.ndarray, current: list[str]) -> np.ndarray:
    """Each row's label in the current label map, by class id (`current`: its class ids by label); -1 for a class
    the current map does not have."""
    index = pd.Index(current)
    return np.asarray(index.get_indexer(pd.Index(ids, dtype=object)), dtype=np.int64)


def newest_rows(ids: np.ndarray, names: np.ndarray, generations: np.ndarray) -> np.ndarray:
    """True for every row that is the newest of its identity (class id, name): the highest generation, and of equal
    generations the last row in shard order; all True when every row is of one generation."""
    if len(generations) == 0 or generations.min() == generations.max():
        return np.ones(len(generations), dtype=bool)
    order = np.lexsort((-np.arange(len(generations)), -np.asarray(generations)))  # newest first
    frame = pd.DataFrame({"id": ids[order], "name": names[order]})
    newest = np.empty(len(order), dtype=bool)
    newest[order] = ~frame.duplicated(keep="first").to_numpy()
    return newest


def in_source(ids: np.ndarray, names: np.ndarray, manifest: pd.DataFrame) -> np.ndarray:
    """True for every row whose identity (class id, name) the current manifest (columns wnid, name) lists."""
    listed = pd.MultiIndex.from_arrays([manifest["wnid"].astype(object), manifest["name"].astype(object)])
    rows = pd.MultiIndex.from_arrays([pd.Index(ids, dtype=object), pd.Index(names, dtype=object)])
    return np.asarray(rows.isin(listed), dtype=bool)


def by_class(ids: np.ndarray, mask: np.ndarray) -> dict[str, int]:
    """Rows of `mask` per class id, sorted by class id."""
    counts = pd.Series(ids[mask], dtype=object).value_counts()
    return {str(k): int(counts[k]) for k in sorted(counts.index, key=str)}

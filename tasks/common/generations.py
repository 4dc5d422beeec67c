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
import pyarrow as pa
import pyarrow.compute as pc

from imagenet_parquet.format import LABEL_MAP_KEYS, class_ids, label_map_from_metadata, own_metadata, shard_generation

REMOVED, REPLACED = "removed from source", "replaced by a newer version"  # the overlay's exclusion reasons


@dataclass(frozen=True)
class ShardClasses:
    """A shard's generation and its own label map (and that map's class ids, by label), and the split its metadata
    names (None: none)."""

    generation: int
    label_map: dict[str, Any]
    ids: list[str]
    split: str | None = None


def shard_classes(
    meta: dict[bytes, bytes] | None, where: Any, seen: dict[Any, ShardClasses] | None = None
) -> ShardClasses:
    """The generation and label map a shard's footer metadata records (FormatError when it has no label map).
    `seen`: the answers for metadata met before (a split's shards share a few: at 19,000 classes a label map is
    ~0.7 MB of JSON per footer, parsed once)."""
    key = tuple((meta or {}).get(name) for name in LABEL_MAP_KEYS)  # not the per-shard byte index: shared by shards
    if seen is not None and key in seen:
        return seen[key]
    label_map = label_map_from_metadata(meta, where)
    split = (own_metadata(meta) or {}).get("split")
    named = split if isinstance(split, str) else None
    found = ShardClasses(shard_generation(meta), label_map, class_ids(label_map), named)
    if seen is not None:
        seen[key] = found
    return found


def identity_keys(ids: pa.Array, names: pa.Array) -> pa.Array:
    """Every row's identity as one Arrow string, `<class id>\\0<name>` (Arrow memory: no Python object per row)."""
    return pc.binary_join_element_wise(ids.cast(pa.string()), names.cast(pa.string()), "\0")


def coded_ids(codes: np.ndarray, vocab: list[str]) -> pa.Array:
    """The class id of every row as an Arrow string array, from its code into `vocab`."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int64()), pa.array(vocab, pa.string())).dictionary_decode()


def current_lookup(vocab: list[str], current: list[str]) -> np.ndarray:
    """Per class id of `vocab` its label in the current label map (`current`: its class ids by label); -1 for a
    class it does not have."""
    index = {name: label for label, name in enumerate(current)}
    return np.asarray([index.get(name, -1) for name in vocab], dtype=np.int64)


def newest_rows(keys: pa.Array, generations: np.ndarray) -> np.ndarray | None:
    """True for every row that is the newest of its identity (`identity_keys`): the highest generation, and of
    equal generations the last row in shard order; None (all newest) when every row is of one generation."""
    count = len(keys)
    if count == 0 or generations.min() == generations.max():
        return None
    order = generations.astype(np.int64) * count + np.arange(count, dtype=np.int64)
    best = pa.table({"key": keys, "order": order}).group_by("key").aggregate([("order", "max")])
    newest = np.zeros(count, dtype=bool)
    newest[best.column("order_max").to_numpy() % count] = True
    return newest


def in_source(keys: pa.Array, manifest: pa.Table) -> np.ndarray:
    """True for every row whose identity (`identity_keys`) the current manifest (columns wnid, name) lists."""
    listed = identity_keys(manifest.column("wnid").combine_chunks(), manifest.column("name").combine_chunks())
    found: np.ndarray = pc.is_in(keys, value_set=listed).to_numpy(zero_copy_only=False)
    return found


def by_class(codes: np.ndarray, vocab: list[str], mask: np.ndarray) -> dict[str, int]:
    """Rows of `mask` per class id (`codes` into `vocab`), sorted by class id."""
    counts = np.bincount(codes[mask], minlength=len(vocab))
    return {vocab[i]: int(counts[i]) for i in sorted(np.flatnonzero(counts), key=lambda i: vocab[i])}

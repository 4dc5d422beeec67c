"""The shards' own label maps and generations, for validate over appended shards (issue 33; the rows' identity:
tasks/common/generations.py).

`shard_sources` reads each shard's generation and label map (from the footers read once). When every shard is of
generation 0 and every overlay format 1 (`mixed` False), validate runs as it always did. Otherwise (`mixed`: an
appended shard, or a format-2 overlay — other label maps, images removed from the source): each shard's metadata
is checked against its own label map, every row gets its class id from its own shard's map and its label as
converted renumbered into label_map.json's (`to_current`; -1: a class the current map no longer has), and the
rows the source holds now (`live`: the newest row of each identity, listed in the manifest) are the ones checked
against the manifests — the others must be excluded by the overlay (format 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from imagenet_parquet.format import FormatError, class_ids, shard_generation
from tasks.common import SPLITS
from tasks.common.generations import ShardClasses, identity_keys, in_source, newest_rows, shard_classes
from tasks.validate.changes import label_map_digest
from tasks.validate.checks import CheckResult, pandera_checks
from tasks.validate.scan import Shard


@dataclass
class Sources:
    """Per shard (plan order) its generation and label map; `mixed`: some shard is appended or has another map."""

    shards: list[ShardClasses]
    mixed: bool

    def map_digests(self, plan: list[Shard]) -> dict[tuple[str, str], str]:
        """(split, shard name) -> a digest of the shard's own label map (the version index's shard digests)."""
        digests = {id(c): label_map_digest(c.label_map) for c in self.shards}  # shards share a few maps
        return {(s.split, s.path.name): digests[id(c)] for s, c in zip(plan, self.shards, strict=True)}


def appended_splits(plan: list[Shard], sources: Sources, label_map: dict[str, Any]) -> set[str]:
    """The splits with an appended shard or a shard of another label map (their overlay must be format 2)."""
    return {s.split for s, c in zip(plan, sources.shards, strict=True) if c.generation or c.label_map != label_map}


def shard_sources(plan: list[Shard], label_map: dict[str, Any], label_maps_overlay: bool) -> Sources:
    """Every shard's generation and own label map; a shard whose label map cannot be read is taken as having
    label_map.json's (the schema_metadata check names it). `label_maps_overlay`: some split's overlay is format 2
    (it gives the labels in label_map.json's numbering, and may exclude rows the source removed): only then may
    shards carry other label maps; else a shard with another one fails schema_metadata, as it always did. `mixed`:
    such an overlay, or an appended shard."""
    shards: list[ShardClasses] = []
    seen: dict[Any, ShardClasses] = {}
    for shard in plan:
        meta = shard.footer.schema.to_arrow_schema().metadata
        try:
            shards.append(shard_classes(meta, shard.path, seen))
        except (FormatError, ValueError, KeyError, TypeError):
            shards.append(ShardClasses(shard_generation(meta), label_map, class_ids(label_map)))
    distinct = {id(s): s for s in shards}.values()
    mixed = label_maps_overlay or any(s.generation for s in distinct)
    return Sources(shards, mixed)


def row_class_ids(meta: pd.DataFrame, plan: list[Shard], sources: Sources) -> np.ndarray:
    """The class id of every row of `meta` (plan order) from its own shard's label map; None for a label out of its
    map's range (the pandera checks name it)."""
    labels = meta["label"].to_numpy(dtype=np.int64, na_value=-1)
    ids = np.full(len(meta), None, dtype=object)
    for shard, own in zip(plan, sources.shards, strict=True):
        part = labels[shard.first : shard.first + shard.rows]
        valid = (part >= 0) & (part < len(own.ids))
        block = np.full(len(part), None, dtype=object)
        block[valid] = np.asarray(own.ids, dtype=object)[part[valid]]
        ids[shard.first : shard.first + shard.rows] = block
    return ids


def to_current(ids: np.ndarray, label_map: dict[str, Any]) -> np.ndarray:
    """Each row's label as converted, in label_map.json's numbering (by class id; -1: a class it does not have)."""
    found = pd.Index(class_ids(label_map), dtype=object).get_indexer(pd.Index(ids, dtype=object))
    return np.asarray(found, dtype=np.int64)


def source_masks(
    meta: pd.DataFrame, ids: np.ndarray, plan: list[Shard], sources: Sources, manifests: dict[str, pd.DataFrame]
) -> dict[str, np.ndarray]:
    """Per row of `meta`: `live` (the source holds it now: the newest row of its identity (class id, name), listed
    in the split's manifest), `removed` (the newest, not listed: removed from the source), `replaced` (an older
    row of an identity a newer generation holds) and `appended` (of generation >= 1)."""
    gens, names = generations(plan, sources), meta["image_path"].to_numpy(dtype=object)
    newest, listed = np.zeros(len(meta), dtype=bool), np.zeros(len(meta), dtype=bool)
    for split in SPLITS:
        rows = np.flatnonzero((meta["split"] == split).to_numpy())
        keys = identity_keys(pa.array(ids[rows], pa.string()), pa.array(names[rows], pa.string()))
        found = newest_rows(keys, gens[rows])
        newest[rows] = True if found is None else found
        manifest = pa.Table.from_pandas(manifests[split][["wnid", "name"]], preserve_index=False)
        listed[rows] = in_source(keys, manifest)
    return {"live": newest & listed, "removed": newest & ~listed, "replaced": ~newest, "appended": gens > 0}


def appended_totals(meta: pd.DataFrame, split: str, masks: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, int]:
    """A split's counts over appended shards: every shard row, the images kept, and the rows removed from the
    source, replaced by a newer version, and appended (kept rows of generation >= 1)."""
    rows = (meta["split"] == split).to_numpy()
    return {
        "rows": int(rows.sum()),
        "images": int((keep & rows).sum()),
        "removed": int((masks["removed"] & rows).sum()),
        "replaced": int((masks["replaced"] & rows).sum()),
        "appended": int((masks["appended"] & keep & rows).sum()),
    }


def generations(plan: list[Shard], sources: Sources) -> np.ndarray:
    """The generation of every row (plan order)."""
    return np.repeat(np.array([s.generation for s in sources.shards], dtype=np.int64), [p.rows for p in plan])


def pandera_by_map(
    meta: pd.DataFrame, plan: list[Shard], sources: Sources, label_map: dict[str, Any], limit: int
) -> list[CheckResult]:
    """The pandera checks of the shards as converted, each shard's rows against its own label map; with appended
    shards, per (generation, label map) — an image may be in two generations (a modified one, the older replaced) —,
    the results of the groups merged into one per check."""
    if not sources.mixed:
        return pandera_checks(meta, label_map, limit)
    groups: dict[tuple[int, str], list[int]] = {}
    digests = {id(c): label_map_digest(c.label_map) for c in sources.shards}
    for i, own in enumerate(sources.shards):
        groups.setdefault((own.generation, digests[id(own)]), []).append(i)
    found = []
    for members in groups.values():
        rows = np.concatenate([np.arange(plan[i].first, plan[i].first + plan[i].rows) for i in members])
        found.append(pandera_checks(meta.iloc[rows], sources.shards[members[0]].label_map, limit))
    return [_merged(list(results), limit) for results in zip(*found, strict=True)]


def _merged(results: list[CheckResult], limit: int) -> CheckResult:
    """One check's results over several groups of rows: the first failure's message, every failure counted."""
    failed = [r for r in results if r.status != "pass"]
    if not failed:
        return results[0]
    examples = [e for r in failed for e in r.examples][:limit]
    return CheckResult(failed[0].name, failed[0].status, failed[0].message, sum(r.failures for r in failed), examples)

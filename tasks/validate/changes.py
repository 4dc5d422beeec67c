"""What changed since the previous version: a small per-version index, tracked in git, and the difference.

`version_index` summarises a version from the validated metadata (no image bytes): per split and class the count and
a digest of its (image, sha256) pairs — of the merged view, the shards with the curation overlay applied, so a
relabel or an exclusion changes its classes —, per shard a digest of its rows as stored (the labels as converted: a
curation-only change rewrites no shard, only the overlay), and the curation lines the curate stage applied to images
in the shards (`<paths.overlay>/curation.json`: `applied` less `not_in_shards`, the lines naming images convert
quarantined, which change no count). `record_version` keeps `<versions>/index.json` = {"current", "previous"}: when
the index of this run differs from the recorded current one, that one becomes the previous version; a rerun of the
same version (CI on a fresh clone) keeps the previous one, so the report shows the change the commit brought.
`<versions>/changes.json` holds the counts (a DVC metric: `dvc metrics diff` shows them).

Why an index in git rather than the previous commit's dvc.lock read through DVC: the lock records a directory
hash only, so reading the old version needs its objects from a cache or remote — a fresh CI clone has neither."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.common import SPLITS, write_json
from tasks.common.params import path_key

INDEX_FILE, CHANGES_FILE = "index.json", "changes.json"
MOVES = ("removed", "restored", "relabelled_in", "relabelled_out")  # what curation lines do to an image


def _digest(values: Any) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def label_map_digest(label_map: dict[str, Any]) -> str:
    """The version index's digest of a label map (its classes: label, wnid, name)."""
    return _digest([[c["label"], c["wnid"], c.get("name")] for c in label_map["classes"]])


def version_index(
    stored: pd.DataFrame,
    merged: pd.DataFrame,
    label_map: dict[str, Any],
    curation: dict[str, Any],
    shard_maps: dict[tuple[str, str], str] | None = None,
    shards: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The index of this version (deterministic: sorted, no timestamps): classes of the `merged` view (the rows
    kept, labels now), shards of the rows `stored` (`shard_digests`; `shards`: those digests, kept from a run over
    the same shards), curation lines of curation.json."""
    index: dict[str, Any] = {"label_map": label_map_digest(label_map), "classes": {}, "shards": {}}
    for split in SPLITS:
        kept = merged[merged["split"] == split]
        images = _grouped(kept["wnid"], kept["image_path"], kept["sha256"])
        index["classes"][split] = {
            wnid: {"count": len(group), "digest": _digest(sorted(group))} for wnid, group in images.items()
        }
    index["shards"] = shards if shards is not None else shard_digests(stored, label_map, shard_maps)
    index["curated"] = curated_lines(curation)
    if "source" in curation:  # appended shards or images removed from the source (issue 33): their counts
        index["source"] = source_counts(curation["source"])
    return index


def shard_digests(
    stored: pd.DataFrame, label_map: dict[str, Any], shard_maps: dict[tuple[str, str], str] | None = None
) -> dict[str, dict[str, str]]:
    """Per split and shard, a digest of its rows as stored (labels as stored: column `label_stored` where present)
    and of the label map they are numbered by: label_map.json's, or with appended shards (`shard_maps`:
    (split, shard) -> the digest of the shard's own label map) the shard's own (a new class rewrites no old shard)."""
    labels = label_map_digest(label_map)
    label_column = "label_stored" if "label_stored" in stored else "label"
    found: dict[str, dict[str, str]] = {}
    for split in SPLITS:
        rows = stored[stored["split"] == split]
        shards = _grouped(rows["shard"], rows["image_path"], rows[label_column], rows["sha256"])
        found[split] = {
            shard: _digest([(shard_maps or {}).get((split, shard), labels), [list(row) for row in group]])
            for shard, group in shards.items()
        }
    return found


SOURCE_COUNTS = {"removed": "removed from source", "replaced": "replaced by a newer version", "appended": "appended"}


def source_counts(source: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per split the rows removed from the source, replaced by a newer version and appended (curation.json
    `source`, written by the curate stage over appended shards)."""
    return {
        split: {key: int(source.get(split, {}).get(reason, {}).get("rows", 0)) for key, reason in SOURCE_COUNTS.items()}
        for split in SPLITS
    }


def _grouped(keys: pd.Series, *columns: pd.Series) -> dict[str, list[tuple[Any, ...]]]:
    """The rows' (columns...) tuples per key, in row order, keys sorted by their string (one pass: a pandas groupby
    per split costs ~1 s at 1,000 classes and 600 shards)."""
    groups: dict[Any, list[tuple[Any, ...]]] = {}
    for key, *values in zip(keys.tolist(), *(c.tolist() for c in columns), strict=True):
        if key is not None and key == key:  # no NaN or None key, as pandas' groupby drops them
            groups.setdefault(key, []).append(tuple(values))
    return {str(key): groups[key] for key in sorted(groups, key=str)}


def curated_lines(curation: dict[str, Any]) -> list[list[Any]]:
    """[kind, split, wnid, name, new_wnid] of every line applied to an image in the shards, sorted."""
    absent = {(x["split"], x["wnid"], x["name"]) for x in curation.get("not_in_shards", [])}
    return sorted(
        [line["kind"], line["split"], line["wnid"], line["name"], line.get("new_wnid")]
        for line in curation.get("applied", [])
        if (line["split"], line["wnid"], line["name"]) not in absent
    )


def record_version(versions_dir: Path, current: dict[str, Any]) -> dict[str, Any]:
    """Update <versions>/index.json and changes.json; return the changes against the previous version."""
    path = versions_dir / INDEX_FILE
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    previous = stored.get("previous") if stored.get("current") == current else stored.get("current")
    write_json(path, {"current": current, "previous": previous}, path_key("versions"))
    changes = compare(previous, current)
    write_json(versions_dir / CHANGES_FILE, changes_metrics(changes), path_key("versions"))
    return changes


def compare(previous: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """Per split: classes whose images changed (added, removed, relabelled in / out) and the shards rewritten."""
    if previous is None:
        return {"previous": False}
    curation = _curation_moves(previous["curated"], current["curated"])
    out: dict[str, Any] = {"previous": True, "label_map_changed": previous["label_map"] != current["label_map"]}
    for split in SPLITS:
        before, after = previous["classes"].get(split, {}), current["classes"].get(split, {})
        classes = []
        for wnid in sorted(set(before) | set(after)):
            old, new = before.get(wnid, {"count": 0}), after.get(wnid, {"count": 0})
            moved = {k: curation[k][(split, wnid)] for k in MOVES}
            if old == new and not any(moved.values()):
                continue
            classes.append({"wnid": wnid, **_class_counts(old["count"], new["count"], moved)})
        old_shards, new_shards = previous["shards"].get(split, {}), current["shards"].get(split, {})
        rewritten = sorted(name for name, digest in new_shards.items() if old_shards.get(name) != digest)
        out[split] = {
            "classes": classes,
            "shards_rewritten": rewritten,
            "shards_removed": sorted(set(old_shards) - set(new_shards)),
            "shards": len(new_shards),
        }
    if "source" in previous or "source" in current:
        _appended_round(previous, current, out)
    return out


def _appended_round(previous: dict[str, Any], current: dict[str, Any], out: dict[str, Any]) -> None:
    """What an append round changed (either version has appended shards or images removed from the source):
    per split the shards added (names new in this version) apart from those rewritten (names of the previous
    version whose rows changed: 0 for an append), the images appended, removed from the source and replaced by a
    newer version since the previous version (the counts' growth), and the class ids new to the dataset."""
    empty = dict.fromkeys(SOURCE_COUNTS, 0)
    for split in SPLITS:
        old_shards, new_shards = previous["shards"].get(split, {}), current["shards"].get(split, {})
        before = previous.get("source", {}).get(split, empty)
        after = current.get("source", {}).get(split, empty)
        found = out[split]
        found["shards_added"] = sorted(set(new_shards) - set(old_shards))
        found["shards_rewritten"] = [name for name in found["shards_rewritten"] if name in old_shards]
        found["source"] = {key: max(after[key] - before[key], 0) for key in SOURCE_COUNTS}
    old = {wnid for split in SPLITS for wnid in previous["classes"].get(split, {})}
    out["new_classes"] = sorted({wnid for split in SPLITS for wnid in current["classes"].get(split, {})} - old)


def _class_counts(before: int, after: int, moved: dict[str, int]) -> dict[str, int]:
    """One class's row: curation moves exact (from the key sets), the rest of the count change (images added or
    removed in the source, or quarantined by convert) as a net count; every number >= 0."""
    curated = moved["restored"] - moved["removed"] + moved["relabelled_in"] - moved["relabelled_out"]
    other = after - before - curated
    return {
        "before": before,
        "after": after,
        "added": moved["restored"] + max(other, 0),
        "removed": moved["removed"] + max(-other, 0),
        "relabelled_in": moved["relabelled_in"],
        "relabelled_out": moved["relabelled_out"],
    }


def _curation_moves(before: list[list[Any]], after: list[list[Any]]) -> dict[str, Counter[tuple[str, str]]]:
    """Per (split, wnid): images the curation lines newly removed, restored (an exclusion undone), relabelled in /
    out — from each curated image's class before and after (its source class where no line names it)."""
    moves: dict[str, Counter[tuple[str, str]]] = {k: Counter() for k in MOVES}
    old, new = _placement(before), _placement(after)
    for image in sorted(set(old) | set(new)):
        split, source_class = image[0], image[1]
        was, now = old.get(image, source_class), new.get(image, source_class)
        if was == now:
            continue
        if now is None:
            moves["removed"][(split, str(was))] += 1
        elif was is None:
            moves["restored"][(split, now)] += 1
        else:
            moves["relabelled_out"][(split, was)] += 1
            moves["relabelled_in"][(split, now)] += 1
    return moves


def _placement(lines: list[list[Any]]) -> dict[tuple[str, str, str], str | None]:
    """(split, source wnid, name) -> the class a curation line puts the image in (None: excluded)."""
    return {(split, wnid, name): None if kind == "exclude" else new_wnid for kind, split, wnid, name, new_wnid in lines}


def changes_metrics(changes: dict[str, Any]) -> dict[str, Any]:
    """The counts for `dvc metrics diff`: per split images added / removed / relabelled, shards rewritten; after
    an append round (issue 33) also images appended / removed from the source / replaced, shards added and the new
    classes (keys present only then: a version without appends keeps today's file byte for byte)."""
    out: dict[str, Any] = {"previous_version": int(changes["previous"])}
    if "new_classes" in changes:
        out["new_classes"] = len(changes["new_classes"])
    for split in SPLITS:
        found = changes.get(split, {"classes": [], "shards_rewritten": [], "shards_removed": [], "shards": 0})
        out[split] = {
            "images_added": sum(c["added"] for c in found["classes"]),
            "images_removed": sum(c["removed"] for c in found["classes"]),
            "images_relabelled": sum(c["relabelled_out"] for c in found["classes"]),
            "classes_changed": len(found["classes"]),
            "shards_rewritten": len(found["shards_rewritten"]),
            "shards_removed": len(found["shards_removed"]),
            "shards": found["shards"],
        }
        if "source" in found:
            out[split].update(
                images_appended=found["source"]["appended"],
                images_removed_from_source=found["source"]["removed"],
                images_replaced=found["source"]["replaced"],
                shards_added=len(found["shards_added"]),
            )
    return out

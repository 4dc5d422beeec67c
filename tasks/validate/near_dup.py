"""Near-duplicate leakage: train/val pairs whose perceptual fingerprints (`phash`, tasks/convert/fingerprint.py)
differ in at most d of 64 bits, found without comparing all pairs, and near-duplicate groups inside train.

Multi-index hashing: the 64 bits are cut into b bands; a pair within distance d < b * (r + 1) has at least one
band within distance r (pigeonhole). Each band of the larger side (train) becomes a dense count table over its
2**w values (CSR: counts, starts, rows sorted by band value); each query's band value and its variants within r
flipped bits are looked up directly, the candidates' full 64-bit distances verified (`popcount`) and the
pairs kept once. b and r are chosen per search to minimise lookups + candidates (`band_plan`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from imagenet_parquet.format import FINGERPRINT_ALGORITHM, FINGERPRINT_COLUMN, own_metadata
from tasks.common import SPLITS
from tasks.common.params import ValidateParams
from tasks.validate.checks import CheckResult, passed
from tasks.validate.near_dup_tolerance import tolerance
from tasks.validate.scan import list_shards

BITS = 64
MAX_BAND_BITS = 22  # a dense table of 2**22 int64 counts (32 MiB) per band at most
CANDIDATE_BLOCK = 1 << 23  # candidates verified per step: bounds memory (~0.5 GiB of temporaries)
VERIFY_COST = 3.0  # a verified candidate costs ~3 lookups (gather, xor, popcount, compare)
Views = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (labels now, keep) of every row, in shard order
PAIR_COLUMNS = ["val_name", "val_wnid", "val_label", "train_name", "train_wnid", "train_label", "distance"]


def popcount(values: np.ndarray) -> np.ndarray:
    """Set bits per uint64 (`np.bitwise_count` on numpy >= 2; the SWAR bit count on the numpy 1.26 the reader
    still allows)."""
    if hasattr(np, "bitwise_count"):
        return np.asarray(np.bitwise_count(values))
    x = values.astype(np.uint64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@dataclass(frozen=True)
class BandPlan:
    widths: tuple[int, ...]  # bits per band, most significant band first
    radius: int  # bits flipped per band lookup


def band_plan(distance: int, queries: int, indexed: int) -> BandPlan:
    """The bands and radius with the fewest estimated operations (lookups + VERIFY_COST * candidates, uniform
    fingerprints) that still guarantee every pair within `distance`: bands * (radius + 1) > distance."""
    best: tuple[float, BandPlan] | None = None
    first = math.ceil(BITS / MAX_BAND_BITS)
    for bands in range(first, max(first, distance + 1) + 1):
        width = math.ceil(BITS / bands)
        full = BITS - bands * (width - 1)  # bands of `width` bits, the others one bit narrower
        widths = tuple([width] * full + [width - 1] * (bands - full))
        radius = distance // bands
        variants = sum(math.comb(width, k) for k in range(radius + 1))
        cost = bands * queries * variants * (1 + VERIFY_COST * indexed / 2**width)
        if best is None or cost < best[0]:
            best = (cost, BandPlan(widths, radius))
    assert best is not None  # radius = distance // bands always qualifies
    return best[1]


def _flips(width: int, radius: int) -> np.ndarray:
    """Every `width`-bit mask with at most `radius` bits set."""
    masks = [0] + [
        sum(1 << b for b in bits) for k in range(1, radius + 1) for bits in itertools.combinations(range(width), k)
    ]
    return np.asarray(masks, dtype=np.int64)


def _band_keys(hashes: np.ndarray, shift: int, width: int) -> np.ndarray:
    return ((hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(np.int64)


def near_pairs(queries: np.ndarray, indexed: np.ndarray, distance: int, self_join: bool = False) -> pd.DataFrame:
    """Every (query row, indexed row, distance) with Hamming distance <= `distance` between the uint64 arrays,
    sorted by (query, indexed). `self_join`: one array against itself, each pair once (query < indexed)."""
    plan = band_plan(distance, len(queries), len(indexed))
    found: list[np.ndarray] = []
    shift = BITS
    for width in plan.widths:
        shift -= width
        found += list(_band_matches(queries, indexed, shift, width, plan.radius, distance, self_join))
    keys = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    q, t = keys // max(len(indexed), 1), keys % max(len(indexed), 1)
    dist = popcount(queries[q] ^ indexed[t]).astype(np.int64)
    return pd.DataFrame({"query": q, "indexed": t, "distance": dist})


def _band_matches(
    queries: np.ndarray, indexed: np.ndarray, shift: int, width: int, radius: int, distance: int, self_join: bool
) -> Iterator[np.ndarray]:
    """Pair keys (query * len(indexed) + indexed) of verified pairs sharing this band within `radius` bits."""
    table_keys = _band_keys(indexed, shift, width)
    order = np.argsort(table_keys, kind="stable")
    counts = np.bincount(table_keys, minlength=1 << width)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    flips = _flips(width, radius)
    query_keys = _band_keys(queries, shift, width)
    step = max(1, int(CANDIDATE_BLOCK / (len(flips) * (1 + len(indexed) / 2**width))))
    for first in range(0, len(queries), step):
        probes = (query_keys[first : first + step, None] ^ flips[None, :]).ravel()
        hits = counts[probes]
        for lo, hi in _pieces(hits):  # skewed (real) fingerprints: many hits per probe, memory still bounded
            probe, hit = probes[lo:hi], hits[lo:hi]
            query_rows = first + np.repeat(np.arange(lo, hi) // len(flips), hit)
            within = np.arange(int(hit.sum())) - np.repeat(np.cumsum(hit) - hit, hit)
            rows = order[np.repeat(starts[probe], hit) + within]
            keep = popcount(queries[query_rows] ^ indexed[rows]) <= distance
            if self_join:
                keep &= query_rows < rows
            yield query_rows[keep] * len(indexed) + rows[keep]


def _pieces(hits: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) slices of the probes with about CANDIDATE_BLOCK candidates each (a probe with more
    alone)."""
    ends = np.cumsum(hits)
    if len(hits) == 0 or ends[-1] <= CANDIDATE_BLOCK:
        return [(0, len(hits))]
    cuts = np.searchsorted(ends, np.arange(CANDIDATE_BLOCK, ends[-1], CANDIDATE_BLOCK), side="right")
    bounds = sorted({0, *(int(c) for c in cuts), len(hits)})
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


# ---------------------------------------------------------------- the shards' fingerprints
def unchecked_reason(schema: pa.Schema) -> str | None:
    """Why a shard's fingerprints cannot be searched (None: they can): no column, switched off, another algorithm."""
    if FINGERPRINT_COLUMN not in schema.names:
        return (
            f"the shards carry no `{FINGERPRINT_COLUMN}` column (written before format 3); "
            "re-run the convert stage to add it"
        )
    own = own_metadata(schema.metadata) or {}
    if (own.get("convert_params") or {}).get("fingerprint") is False:
        return (
            f"convert.fingerprint is false, so the shards' `{FINGERPRINT_COLUMN}` is null; set convert.fingerprint: "
            "true in params.yaml and re-run the convert stage to check near-duplicates"
        )
    found = own.get("fingerprint_algorithm")
    if found != FINGERPRINT_ALGORITHM:
        return (
            f"the shards' fingerprints are {found!r}, these distances are calibrated for {FINGERPRINT_ALGORITHM!r}; "
            "re-run the convert stage"
        )
    return None


@dataclass(frozen=True)
class Fingerprints:
    """One split's fingerprints, in shard order: `frame` holds phash (uint64), valid (false also for a row the
    overlay excludes), label (int32: the label now, the overlay's), source (int32: the label as converted — the
    class as found, which names the image in curation lines), shard (an index into `shards`) and row (int32) —
    ~25 B a row; names are read for the pairs found only."""

    frame: pd.DataFrame
    shards: list[Path]


def read_fingerprints(
    parquet_dir: str | Path, views: Views | None = None
) -> tuple[dict[str, Fingerprints], str | None]:
    """Per split the Fingerprints; or none and the `unchecked_reason` of the first shard whose fingerprints
    cannot be searched. Reads the `phash` and `label` columns only (not `image.path`: ~100 B a row as strings).
    `views`: per split the overlay's (labels, keep) of every row in shard order (None: the shards as converted)."""
    found: dict[str, Fingerprints] = {}
    for split, paths in list_shards(parquet_dir).items():
        columns: dict[str, list[np.ndarray]] = {"phash": [], "valid": [], "label": [], "shard": [], "row": []}
        for i, path in enumerate(paths):
            shard = pq.ParquetFile(path)
            reason = unchecked_reason(shard.schema_arrow)
            if reason is not None:
                return {}, reason
            table = shard.read(columns=["label", FINGERPRINT_COLUMN], use_threads=False)
            prints = table.column(FINGERPRINT_COLUMN)
            columns["phash"].append(prints.fill_null(0).to_numpy())
            columns["valid"].append(prints.is_valid().to_numpy(zero_copy_only=False))
            columns["label"].append(table.column("label").to_numpy().astype(np.int32))
            columns["shard"].append(np.full(len(table), i, dtype=np.int32))
            columns["row"].append(np.arange(len(table), dtype=np.int32))
        frame = pd.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})
        frame["source"] = frame["label"]
        if views is not None and split in views:
            labels, keep = views[split]
            frame["label"] = np.asarray(labels).astype(np.int32)
            frame["valid"] &= np.asarray(keep, dtype=bool)
        found[split] = Fingerprints(frame, list(paths))
    return found, None


def _named(prints: Fingerprints, rows: pd.DataFrame, classes: list[str] | None) -> pd.DataFrame:
    """`rows` (of prints.frame) with name (image.path), wnid (the class as found, as curation lines name the
    image: the label map's class id of the label as converted — the folder name of a dataset not named by wnids —
    else the shard's column), label (the label now) and shard as a file name, read from their shards only."""
    names = np.empty(len(rows), dtype=object)
    wnids = np.empty(len(rows), dtype=object)
    for shard, at in rows.groupby("shard").indices.items():
        table = pq.ParquetFile(prints.shards[shard]).read(columns=["image.path", "wnid"], use_threads=False)
        take = pa.array(rows["row"].to_numpy()[at])
        names[at] = table.column("image").combine_chunks().field("path").take(take).to_numpy(zero_copy_only=False)
        wnids[at] = table.column("wnid").take(take).to_numpy(zero_copy_only=False)
    labels, source = rows["label"].to_numpy(), rows["source"].to_numpy()
    if classes is not None:
        known = (source >= 0) & (source < len(classes))  # a label out of range (failed elsewhere) keeps the shard's
        wnids[known] = np.array(classes, dtype=object)[source[known]]
    shard_names = np.array([p.name for p in prints.shards], dtype=object)[rows["shard"].to_numpy()]
    return pd.DataFrame(
        {
            "name": names,
            "wnid": wnids,
            "label": labels.astype(np.int64),
            "shard": shard_names,
            "row": rows["row"].to_numpy().astype(np.int64),
        }
    )


def train_val_pairs(prints: dict[str, Fingerprints], distance: int, classes: list[str] | None = None) -> pd.DataFrame:
    """The train/val pairs within `distance`, one row each (PAIR_COLUMNS + shards/rows + cross_class), sorted:
    cross-class pairs first, then by distance, val name, train name."""
    train, val = (prints[s].frame[prints[s].frame["valid"]].reset_index(drop=True) for s in SPLITS)
    found = near_pairs(val["phash"].to_numpy(np.uint64), train["phash"].to_numpy(np.uint64), distance)
    v = _named(prints["val"], val.iloc[found["query"]].reset_index(drop=True), classes)
    t = _named(prints["train"], train.iloc[found["indexed"]].reset_index(drop=True), classes)
    pairs = pd.concat([v.add_prefix("val_"), t.add_prefix("train_")], axis=1).assign(distance=found["distance"])
    pairs["cross_class"] = pairs["val_label"] != pairs["train_label"]
    pairs = pairs.sort_values(
        ["cross_class", "distance", "val_name", "train_name"], ascending=[False, True, True, True]
    )
    keep = [*PAIR_COLUMNS, "cross_class", "val_shard", "val_row", "train_shard", "train_row"]
    return pairs[keep].reset_index(drop=True)


def train_groups(prints: dict[str, Fingerprints], distance: int) -> dict[str, int]:
    """Groups of near-duplicate images inside train (connected components of the pairs within `distance`)."""
    train = prints["train"].frame
    hashes = train.loc[train["valid"], "phash"].to_numpy(np.uint64)
    found = near_pairs(hashes, hashes, distance, self_join=True)
    if found.empty:
        return {"groups": 0, "images": 0, "pairs": 0, "distance": distance}
    graph = coo_matrix((np.ones(len(found)), (found["query"], found["indexed"])), shape=(len(hashes),) * 2)
    _, component = connected_components(graph, directed=False)
    sizes = np.bincount(component)
    return {
        "groups": int((sizes > 1).sum()),
        "images": int(sizes[sizes > 1].sum()),
        "pairs": len(found),
        "distance": distance,
    }


# ---------------------------------------------------------------- the check
def near_duplicate_check(
    parquet_dir: str | Path, params: ValidateParams, classes: list[str] | None = None, views: Views | None = None
) -> tuple[CheckResult, dict[str, Any]]:
    """The `near_duplicates` check and the report's `near_duplicates` section (every pair, the train groups, the
    chance level and the tolerance: tasks.validate.near_dup_tolerance); `classes`: the label map's class ids by
    label (see _named); `views`: the overlay's (labels, keep) per split — an excluded image is neither searched
    nor counted, and `cross_class` compares the labels now."""
    distance, train_distance = params.near_duplicates_distance, params.near_duplicates_train_distance
    prints, reason = read_fingerprints(parquet_dir, views)
    if reason is not None:
        section = {"checked": False, "reason": reason, "distance": distance, "pairs": []}
        return CheckResult("near_duplicates", "warn", f"not checked: {reason}"), section
    pairs, groups = train_val_pairs(prints, distance, classes), train_groups(prints, train_distance)
    train, val = (int(prints[s].frame["valid"].sum()) for s in SPLITS)
    allowed = tolerance(train, val, distance, params.near_duplicates_max_pairs, params.near_duplicates_chance_margin)
    section = {
        "checked": True,
        "distance": distance,
        "chance": allowed.as_dict(),
        "train_groups": groups,
        "pairs": pairs.to_dict("records"),
    }
    inside = (
        f"; inside train: {groups['groups']} group(s) of {groups['images']} images within distance {train_distance}"
    )
    if pairs.empty:
        message = f"no train/val pair within Hamming distance {distance} ({allowed.describe()}){inside}"
        return passed("near_duplicates", message), section
    first, cross = pairs.iloc[0], int(pairs["cross_class"].sum())
    message = (
        f"{len(pairs)} train/val near-duplicate pair(s) within Hamming distance {distance} "
        f"({pairs['val_name'].nunique()} val images; {cross} across classes: also a label problem; "
        f"{allowed.describe()}) — e.g. val {first['val_wnid']}/{first['val_name']} ~ train "
        f"{first['train_wnid']}/{first['train_name']} (distance {first['distance']}); review near_duplicates.png, "
        f"then copy near_duplicates_exclude.csv to the curation exclude list{inside}"
    )
    examples = pairs[[*PAIR_COLUMNS, "cross_class"]].head(params.report_examples).to_dict("records")
    return CheckResult("near_duplicates", allowed.status(len(pairs)), message, len(pairs), examples), section

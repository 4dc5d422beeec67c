"""Near-duplicate leakage: train/val pairs whose perceptual fingerprints (`phash`, tasks/convert/fingerprint.py)
differ in at most d of 64 bits, found without comparing all pairs, and near-duplicate groups inside train.

Multi-index hashing: the 64 bits are cut into b bands; a pair within distance d < b * (r + 1) has at least one
band within distance r (pigeonhole). Each band of the larger side (train) becomes a dense count table over its
2**w values (CSR: counts, starts, rows sorted by band value); each query's band value and its variants within r
flipped bits are looked up directly, the candidates' full 64-bit distances verified (`popcount`) and the
pairs kept once. b and r are chosen per search to minimise lookups + candidates (`band_plan`).

How many pairs the check tolerates before it fails (`tolerance`): unrelated images still fall within the distance
now and then, and those chance pairs grow with train x val: the same distance gives ~8e2 of them among
ImageNet-1k's 6.4e10 comparisons and ~8e4 among ImageNet-21k's ~6e12. A fixed count cannot fit both, so the
tolerance scales with the comparisons: the pairs expected by chance between unrelated uniform fingerprints
(`chance_probability`: dct64-v2 sets exactly 32 of its 64 bits, so a distance is even, 2j for j ones of one print
where the other has zeros: sum over j <= d/2 of C(32, j)^2 / C(64, 32)), times params
validate.near_duplicates_chance_margin — real photos' fingerprints cluster, so more pairs than uniform ones (~17x at
distance 8: 10 pairs among 8e8 comparisons of 40,000 distinct real JPEGs, against 0.58 expected) — with
validate.near_duplicates_max_pairs as the floor (margin 0: that fixed count alone, as before).

The searches are kept in the stage's scratch space while the fingerprints are unchanged (`PairCache`): a
curation round changes labels and keep flags only, so it searches nothing again.

What a reviewer acts on after the check (`write_near_duplicate_outputs`): the pairs side by side
(near_duplicates.png) and the candidate exclude list (near_duplicates_exclude.csv) in the curation format
`split,wnid,name,reason` — one row per val image of a pair, sorted — ready to review and copy to the curation
exclude list (params curate.exclude). Both are deterministic (fixed layout, Pillow's built-in font, no PNG
metadata; sorted CSV)."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import math
import os
import textwrap
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageFont
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from imagenet_parquet.format import FINGERPRINT_ALGORITHM, FINGERPRINT_COLUMN, own_metadata
from tasks.common import SPLITS, atomic_path, write_text
from tasks.common.params import ValidateParams, path_key
from tasks.validate.checks import CheckResult, passed
from tasks.validate.contact_sheet import THUMB, Picks, _paste, read_thumbnails
from tasks.validate.scan import list_shards

BITS, WEIGHT = 64, 32  # dct64-v2: 64-bit fingerprints, each with 32 bits set (above the median)
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


# ---------------------------------------------------------------- searches kept in scratch
NEAR_DIR = "near"  # under the validate work directory, beside scan/
PAIRS_VERSION = "near-pairs-v1"  # in every key: a change of what a search returns makes the kept files unused


class PairCache:
    """Near-duplicate searches kept in the validate stage's scratch space (`<paths.work>/validate/near/`; None:
    nothing kept, every search runs).

    A search's result is a function of its inputs alone (the fingerprints searched, the distance, whether it is a
    self-join), so it is kept under a SHA-256 of them and reused while they are unchanged: a curation round changes
    labels and keep flags, never a fingerprint, and the searches run over every fingerprinted row (the pairs of
    excluded rows dropped after: `_searched`), so it searches nothing again (at ImageNet-1k ~12 of validate's ~40
    CPU-s). A kept file is used only when it parses, its indices lie inside the inputs and every stored distance
    equals the one recomputed from the fingerprints and is within the search distance; else the search runs again
    and replaces it (written atomically). `prune()` removes the files this run did not use."""

    def __init__(self, directory: Path | None) -> None:
        self.directory, self.used = directory, set[str]()

    def pairs(self, queries: np.ndarray, indexed: np.ndarray, distance: int, self_join: bool) -> pd.DataFrame:
        """`near_pairs(queries, indexed, distance, self_join)`, or its kept result."""
        if self.directory is None:
            return near_pairs(queries, indexed, distance, self_join)
        digest = hashlib.sha256(f"{PAIRS_VERSION}:{distance}:{self_join}:{len(queries)}:".encode())
        digest.update(np.ascontiguousarray(queries, dtype=np.uint64).tobytes())
        digest.update(np.ascontiguousarray(indexed, dtype=np.uint64).tobytes())
        path = self.directory / f"{digest.hexdigest()}.npz"
        self.used.add(path.name)
        kept = _load_pairs(path, queries, indexed, distance, self_join)
        if kept is not None:
            return kept
        found = near_pairs(queries, indexed, distance, self_join)
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as out:
            np.savez(out, **{k: found[k].to_numpy(np.int64) for k in ("query", "indexed", "distance")})
        return found

    def prune(self) -> None:
        """Remove the kept searches this run did not use."""
        if self.directory is None or not self.directory.is_dir():
            return
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".npz") and name not in self.used:
                (self.directory / name).unlink(missing_ok=True)


def _load_pairs(
    path: Path, queries: np.ndarray, indexed: np.ndarray, distance: int, self_join: bool
) -> pd.DataFrame | None:
    """The kept result at `path` when it is whole and agrees with the fingerprints; else None."""
    try:
        with np.load(path, allow_pickle=False) as kept:
            q, t, d = (np.asarray(kept[k], dtype=np.int64) for k in ("query", "indexed", "distance"))
    except (OSError, ValueError, KeyError):
        return None
    if not (len(q) == len(t) == len(d)):
        return None
    if len(q) and (q.min() < 0 or t.min() < 0 or q.max() >= len(queries) or t.max() >= len(indexed)):
        return None
    if len(q) and (np.any(d > distance) or np.any(popcount(queries[q] ^ indexed[t]) != d)):
        return None
    if self_join and np.any(q >= t):
        return None
    return pd.DataFrame({"query": q, "indexed": t, "distance": d})


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
    """One split's fingerprints, in shard order: `frame` holds phash (uint64), printed (the row has one), valid
    (printed and not excluded by the overlay), label (int32: the label now, the overlay's), source (int32: the label
    as converted — the class as found, which names the image in curation lines), shard (an index into `shards`) and
    row (int32) — ~25 B a row; names are read for the pairs found only."""

    frame: pd.DataFrame
    shards: list[Path]


def read_fingerprints(
    parquet_dir: str | Path, views: Views | None = None, converted: dict[str, np.ndarray] | None = None
) -> tuple[dict[str, Fingerprints], str | None]:
    """Per split the Fingerprints; or none and the `unchecked_reason` of the first shard whose fingerprints
    cannot be searched. Reads the `phash` and `label` columns only (not `image.path`: ~100 B a row as strings).
    `views`: per split the overlay's (labels, keep) of every row in shard order (None: the shards as converted)."""
    found: dict[str, Fingerprints] = {}
    for split, paths in list_shards(parquet_dir).items():
        columns: dict[str, list[np.ndarray]] = {"phash": [], "printed": [], "label": [], "shard": [], "row": []}
        for i, path in enumerate(paths):
            shard = pq.ParquetFile(path)
            reason = unchecked_reason(shard.schema_arrow)
            if reason is not None:
                return {}, reason
            table = shard.read(columns=["label", FINGERPRINT_COLUMN], use_threads=False)
            prints = table.column(FINGERPRINT_COLUMN)
            columns["phash"].append(prints.fill_null(0).to_numpy())
            columns["printed"].append(prints.is_valid().to_numpy(zero_copy_only=False))
            columns["label"].append(table.column("label").to_numpy().astype(np.int32))
            columns["shard"].append(np.full(len(table), i, dtype=np.int32))
            columns["row"].append(np.arange(len(table), dtype=np.int32))
        frame = pd.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})
        frame["valid"] = frame["printed"].to_numpy().copy()
        frame["source"] = frame["label"] if converted is None else np.asarray(converted[split]).astype(np.int32)
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


def train_val_pairs(
    prints: dict[str, Fingerprints], distance: int, classes: list[str] | None = None, cache: PairCache | None = None
) -> pd.DataFrame:
    """The train/val pairs within `distance`, one row each (PAIR_COLUMNS + shards/rows + cross_class), sorted:
    cross-class pairs first, then by distance, val name, train name. Searched over every fingerprinted row (kept in
    `cache` while the fingerprints are unchanged), the pairs of a row the overlay excludes dropped after."""
    train, val = (prints[s].frame[prints[s].frame["printed"]].reset_index(drop=True) for s in SPLITS)
    found = _searched(val, train, distance, False, cache)
    v = _named(prints["val"], val.iloc[found["query"]].reset_index(drop=True), classes)
    t = _named(prints["train"], train.iloc[found["indexed"]].reset_index(drop=True), classes)
    pairs = pd.concat([v.add_prefix("val_"), t.add_prefix("train_")], axis=1).assign(distance=found["distance"])
    pairs["cross_class"] = pairs["val_label"] != pairs["train_label"]
    pairs = pairs.sort_values(
        ["cross_class", "distance", "val_name", "train_name"], ascending=[False, True, True, True]
    )
    keep = [*PAIR_COLUMNS, "cross_class", "val_shard", "val_row", "train_shard", "train_row"]
    return pairs[keep].reset_index(drop=True)


def train_groups(prints: dict[str, Fingerprints], distance: int, cache: PairCache | None = None) -> dict[str, int]:
    """Groups of near-duplicate images inside train (connected components of the pairs within `distance`; searched
    as train_val_pairs does)."""
    train = prints["train"].frame
    train = train[train["printed"]].reset_index(drop=True)
    found = _searched(train, train, distance, True, cache)
    hashes = train["phash"].to_numpy(np.uint64)
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


def _searched(
    queries: pd.DataFrame, indexed: pd.DataFrame, distance: int, self_join: bool, cache: PairCache | None
) -> pd.DataFrame:
    """near_pairs of the frames' fingerprints (kept in `cache`), the pairs of rows not `valid` dropped."""
    q, t = (frame["phash"].to_numpy(np.uint64) for frame in (queries, indexed))
    found = (cache or PairCache(None)).pairs(q, t, distance, self_join)
    valid_q, valid_t = queries["valid"].to_numpy(), indexed["valid"].to_numpy()
    keep = valid_q[found["query"].to_numpy()] & valid_t[found["indexed"].to_numpy()]
    return found[keep].reset_index(drop=True)


# ---------------------------------------------------------------- the tolerance
def chance_probability(distance: int, bits: int = BITS, weight: int = WEIGHT) -> float:
    """P(Hamming distance <= `distance`) between two independent uniform `bits`-bit fingerprints with `weight` bits
    set each (hypergeometric: the distance is 2j where j of one's set bits are unset in the other)."""
    ways = sum(math.comb(weight, j) * math.comb(bits - weight, j) for j in range(min(distance // 2, weight) + 1))
    return ways / math.comb(bits, weight)


@dataclass(frozen=True)
class Tolerance:
    """The chance level and the tolerated count of one train/val search."""

    comparisons: int  # train x val fingerprint pairs
    expected: float  # pairs expected by chance between uniform fingerprints
    tolerated: int  # max(max_pairs, floor(margin x expected))
    max_pairs: int
    margin: float

    def status(self, found: int) -> str:
        return "warn" if found <= self.tolerated else "fail"

    def describe(self) -> str:
        """The figures in words, for the check's message."""
        return (
            f"expected by chance: {self.expected:.3g} among {self.comparisons:.3g} train x val comparisons "
            f"(unrelated uniform fingerprints); tolerated: {self.tolerated} = max(params.yaml "
            f"validate.near_duplicates_max_pairs {self.max_pairs}, validate.near_duplicates_chance_margin "
            f"{self.margin:g} x expected)"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tolerance(train: int, val: int, distance: int, max_pairs: int, margin: float) -> Tolerance:
    """The tolerance of a search of `val` fingerprints against `train` ones within `distance` bits."""
    comparisons = train * val
    expected = comparisons * chance_probability(distance)
    return Tolerance(comparisons, expected, max(max_pairs, math.floor(margin * expected)), max_pairs, margin)


# ---------------------------------------------------------------- the check
def near_duplicate_check(
    parquet_dir: str | Path,
    params: ValidateParams,
    classes: list[str] | None = None,
    views: Views | None = None,
    converted: dict[str, np.ndarray] | None = None,
    cache: PairCache | None = None,
) -> tuple[CheckResult, dict[str, Any]]:
    """The `near_duplicates` check and the report's `near_duplicates` section (every pair, the train groups, the
    chance level and the tolerance: `tolerance`); `classes`: the label map's class ids by
    label (see _named); `views`: the overlay's (labels, keep) per split — an excluded image is neither searched
    nor counted, and `cross_class` compares the labels now; `converted` (shards with several label maps): per split
    every row's label as converted in the numbering of `classes` (else the label stored, the same then)."""
    distance, train_distance = params.near_duplicates_distance, params.near_duplicates_train_distance
    prints, reason = read_fingerprints(parquet_dir, views, converted)
    if reason is not None:
        section = {"checked": False, "reason": reason, "distance": distance, "pairs": []}
        return CheckResult("near_duplicates", "warn", f"not checked: {reason}"), section
    pairs, groups = train_val_pairs(prints, distance, classes, cache), train_groups(prints, train_distance, cache)
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


# ---------------------------------------------------------------- the reviewer's outputs
NEAR_DUPLICATES_PNG = "near_duplicates.png"
EXCLUDE_CSV = "near_duplicates_exclude.csv"
EXCLUDE_HEADER = ["split", "wnid", "name", "reason"]
MAX_PICTURED = 60  # pairs drawn (the first ones of the report's order: cross-class first, then by distance)
ROW, CAPTION_X, WIDTH = THUMB + 8, 2 * THUMB + 24, 2 * THUMB + 24 + 460


def exclude_rows(pairs: list[dict[str, Any]]) -> list[list[str]]:
    """One row per val image of a pair, naming its closest train image (then the first by name), sorted."""
    closest: dict[tuple[str, str], dict[str, Any]] = {}
    for pair in sorted(pairs, key=lambda p: (p["distance"], p["train_wnid"], p["train_name"])):
        closest.setdefault((pair["val_wnid"], pair["val_name"]), pair)
    rows = []
    for (wnid, name), pair in sorted(closest.items()):
        other = ", another class" if pair["cross_class"] else ""
        reason = (
            f"near-duplicate of train/{pair['train_wnid']}/{pair['train_name']} (distance {pair['distance']}{other})"
        )
        rows.append(["val", wnid, name, reason])
    return rows


def exclude_csv(pairs: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([EXCLUDE_HEADER, *exclude_rows(pairs)])
    return buf.getvalue()


def draw_pairs(
    pairs: list[dict[str, Any]], parquet_dir: Path, total: int, empty: str = "no near-duplicate pair"
) -> Image.Image:
    """One line per pair: val thumbnail, train thumbnail, names, classes and distance (cross-class in red);
    `empty` is what the picture says when there is none."""
    shown = pairs[:MAX_PICTURED]
    picks: Picks = {
        (split, i): [(parquet_dir / split / p[f"{split}_shard"], int(p[f"{split}_row"]))]
        for i, p in enumerate(shown)
        for split in ("val", "train")
    }
    thumbs = read_thumbnails(picks)
    sheet = Image.new("RGB", (WIDTH, 28 + max(1, len(shown)) * ROW), "white")
    draw, font = ImageDraw.Draw(sheet), ImageFont.load_default(size=13)
    title = f"{total} train/val near-duplicate pair(s)" + (f", first {len(shown)}" if total > len(shown) else "")
    draw.text((8, 6), title + "   (val | train)", fill="black", font=font)
    for i, pair in enumerate(shown):
        y = 28 + i * ROW
        for col, split in enumerate(("val", "train")):
            x = 8 + col * (THUMB + 8)
            _paste(sheet, draw, (x, y, x + THUMB - 1, y + THUMB - 1), thumbs.get(picks[split, i][0]), False)
        colour = "red" if pair["cross_class"] else "black"
        lines = [
            f"val   {pair['val_wnid']}/{pair['val_name']}",
            f"train {pair['train_wnid']}/{pair['train_name']}",
            f"distance {pair['distance']}" + ("   CROSS-CLASS: also a label problem" if pair["cross_class"] else ""),
        ]
        for k, text in enumerate(lines):
            draw.text((CAPTION_X, y + 4 + 20 * k), text, fill=colour, font=font)
    if not shown:
        draw.multiline_text((8, 34), textwrap.fill(empty, 88), fill="dimgray", font=font)
    return sheet


def write_near_duplicate_outputs(
    report: dict[str, Any], parquet_dir: str | Path, reports_dir: str | Path
) -> list[Path]:
    """near_duplicates.png and near_duplicates_exclude.csv under `reports_dir` (atomic), from the report's
    `near_duplicates` section (empty outputs when the check found nothing or could not run)."""
    near = report.get("near_duplicates", {})
    pairs = near.get("pairs", [])
    empty = "no near-duplicate pair" if near.get("checked", True) else f"not checked: {near['reason']}"
    out_png = Path(reports_dir) / NEAR_DUPLICATES_PNG
    with atomic_path(out_png, path_key("reports")) as tmp:
        draw_pairs(pairs, Path(parquet_dir), len(pairs), empty).save(tmp, "PNG")
    return [out_png, write_text(Path(reports_dir) / EXCLUDE_CSV, exclude_csv(pairs), path_key("reports"))]

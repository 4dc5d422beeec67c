"""Near-duplicate check: fingerprint CPU per image (own DCT hash vs `imagehash.phash`), quality (recall on planted
near-duplicates, false pairs among distinct real images) and the banded search at ImageNet-1k size.

  fingerprint  CPU ms per image over real JPEGs (../shared/data/imagenet-samples; else the built-in sample's),
               own (tasks/convert/fingerprint.py), imagehash.phash (when installed; `pip install imagehash`), and
               the floor: Pillow's reduced decode alone (draft + load, no hash)
  quality      per edit of tests/helpers/planted.py (plus a 2-5 % crop of EACH side, a harder reading), the recall
               at the default distance (params.yaml validate.near_duplicates_distance); the smallest distance
               between two distinct real images and the false pairs among them
  search       synthetic uniform fingerprints, --train x --val (default 1,281,167 x 50,000) with --planted near
               copies: tasks.validate.near_dup.near_pairs (CPU s, peak RSS) next to brute force on a slice,
               projected; and the groups-inside-train self-join at validate.near_duplicates_train_distance
  projection   (--project TRAIN VAL) the fingerprint's CPU and both searches measured at --train x --val, scaled
               by the band plan's cost model to TRAIN x VAL (ImageNet-21k with a 50-per-class holdout: 12.05 M x
               0.95 M), with the memory the search and the read fingerprints need

    python -m benchmarks.bench_near_dup                       # everything, ImageNet-1k search size
    python -m benchmarks.bench_near_dup --train 200000 --val 10000 --skip-quality
    python -m benchmarks.bench_near_dup --skip-quality --skip-search --project 12050000 950000   # 13 M (21k)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import resource
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pandas as pd
import scipy.fft
from PIL import Image

from benchmarks.common import WORK
from tasks.acquire.sample import write_sample
from tasks.convert.fingerprint import GRID, HASH_SIDE, fingerprint, grey_grid, stored_fingerprint
from tasks.convert.imaging import Policy, encode_image
from tasks.validate.near_dup import CANDIDATE_BLOCK, VERIFY_COST, band_plan, near_pairs
from tests.helpers.params import validate_section
from tests.helpers.planted import EDITS, crop, real_images, sample_images

DEFAULT = validate_section()
T = TypeVar("T")
R = TypeVar("R")
Hasher = Callable[[bytes], int]


def cpu(fn: Callable[[T], R], items: Sequence[T]) -> tuple[float, list[R]]:
    """CPU ms per item of `fn` over `items`, and its results."""
    start = time.process_time()
    out = [fn(x) for x in items]
    return (time.process_time() - start) / len(items) * 1e3, out


def imagehash_fn() -> Hasher | None:
    """imagehash.phash as an int, or None when imagehash is not installed (an optional peer)."""
    try:
        import imagehash
    except ImportError:
        return None

    def phash(data: bytes) -> int:
        with Image.open(io.BytesIO(data)) as image:
            return int(str(imagehash.phash(image)), 16)

    return phash


_DCT_V1 = scipy.fft.dct(np.eye(GRID), norm="ortho", axis=0)[:HASH_SIDE]  # the first rows of the orthonormal DCT-II


def fingerprint_v1(data: bytes) -> int:
    """The previous algorithm, dct64-v1, for comparison: u, v = 0..7, the DC term in the median (top bit always 1)."""
    low = _DCT_V1 @ grey_grid(data) @ _DCT_V1.T
    return int.from_bytes(np.packbits((low > np.median(low)).ravel()).tobytes(), "big")


V1 = "dct64-v1 (previous: DC in the median)"
OWN = "own (tasks/convert/fingerprint.py)"


def decode_floor(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as image:
        image.draft("L", (64, 64))
        image.load()


def images() -> tuple[str, list[bytes]]:
    real = real_images()
    if real:
        return "real ImageNet samples", [d for _, d in real]
    out = WORK / "near_dup_sample"
    if not (out / "ILSVRC2012_img_train.tar").is_file():
        write_sample(out)
    return "built-in sample images (no ../shared)", [d for _, d in sample_images(out, 1000)]


def bench_fingerprint(datas: list[bytes]) -> dict[str, list[int]]:
    kb = np.mean([len(d) for d in datas]) / 1e3
    print(f"\n## fingerprint: CPU ms per image ({len(datas)} images, mean {kb:.0f} KB)")
    print("| method | ms/image | vs own |\n|---|---|---|")
    hashers: dict[str, Hasher] = {OWN: fingerprint, V1: fingerprint_v1}
    phash = imagehash_fn()
    if phash:
        hashers["imagehash.phash"] = phash
    results = {name: cpu(fn, datas) for name, fn in hashers.items()}
    floor_ms, _ = cpu(decode_floor, datas)
    own_ms = results[OWN][0]
    for name, ms in [*((n, r[0]) for n, r in results.items()), ("floor: reduced decode only", floor_ms)]:
        print(f"| {name} | {ms:.3f} | {ms / own_ms:.2f}x |")
    return {name: hashes for name, (_, hashes) in results.items()}


def bench_convert_cost(datas: list[bytes]) -> None:
    """What the fingerprint adds to convert's per-image work (pass-through policy: header check + SHA-256)."""
    policy = Policy()

    def without(data: bytes) -> None:
        hashlib.sha256(encode_image(data, policy).data).hexdigest()

    def with_fingerprint(data: bytes) -> None:
        enc = encode_image(data, policy)
        hashlib.sha256(enc.data).hexdigest()
        stored_fingerprint(enc.data)

    base, _ = cpu(without, datas)
    full, _ = cpu(with_fingerprint, datas)
    print("\n## convert's per-image CPU (pass-through), without and with the fingerprint")
    print(
        f"| convert row | ms/image | ratio |\n|---|---|---|\n| without phash | {base:.3f} | 1.00x |\n"
        f"| with phash | {full:.3f} | {full / base:.2f}x |"
    )


def bench_quality(datas: list[bytes], hashed: dict[str, list[int]], bases: int) -> None:
    d = DEFAULT.near_duplicates_distance
    edits = {**EDITS, **{f"crop{c}pct-each-side": crop(2 * c / 100) for c in (2, 3.5, 5)}}
    fns: dict[str, Hasher] = {OWN: fingerprint, V1: fingerprint_v1}
    phash = imagehash_fn()
    if phash:
        fns["imagehash.phash"] = phash
    print(f"\n## quality at distance {d}: recall per edit over {bases} base images (max distance seen)")
    names = [n for n in hashed if n in fns]
    print("| edit | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    planted: dict[str, list[bytes]] = {}
    for edit, fn in edits.items():
        copies = []
        for data in datas[:bases]:
            with Image.open(io.BytesIO(data)) as image:
                copies.append(fn(image.convert("RGB")))
        planted[edit] = copies
    totals = dict.fromkeys(names, 0)
    for edit, copies in planted.items():
        cells = []
        for n in names:
            dist = [bin(fns[n](c) ^ hashed[n][i]).count("1") for i, c in enumerate(copies)]
            hit = sum(x <= d for x in dist)
            totals[n] += hit if "each-side" not in edit else 0
            cells.append(f"{hit / len(dist):.2f} (max {max(dist)})")
        print(f"| {edit} | " + " | ".join(cells) + " |")
    print(
        f"| **issue's planted set (first {len(EDITS)} rows)** | "
        + " | ".join(f"**{totals[n] / (bases * len(EDITS)):.3f}**" for n in names)
        + " |"
    )
    recall_by_distance(planted, hashed, fns, names, d)
    distinct_pairs(hashed, names, d)


def recall_by_distance(
    planted: dict[str, list[bytes]], hashed: dict[str, list[int]], fns: dict[str, Hasher], names: list[str], d: int
) -> None:
    """The issue's planted set (EDITS) and the 2-5 % each-side crops: recall at distances around the default."""
    print("\n## recall by distance (planted set | each-side crops)")
    print("| method | " + " | ".join(f"<= {k}" for k in range(d - 2, d + 3)) + " |\n|---|" + "---|" * 5)
    for n in names:
        dist = {e: [bin(fns[n](c) ^ hashed[n][i]).count("1") for i, c in enumerate(cs)] for e, cs in planted.items()}
        base = [x for e, xs in dist.items() if "each-side" not in e for x in xs]
        side = [x for e, xs in dist.items() if "each-side" in e for x in xs]
        cells = [
            f"{np.mean(np.array(base) <= k):.3f} \\| {np.mean(np.array(side) <= k):.2f}" for k in range(d - 2, d + 3)
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")


def distinct_pairs(
    hashed: dict[str, list[int]], names: list[str], d: int, pairs_1k: float = 1_281_167 * 50_000
) -> None:
    """Distances between distinct real photos: the smallest, the pairs within d, the bits that carry nothing, and
    the chance pairs among ImageNet-1k's train x val pairs from a normal fit of the distance distribution."""
    print(f"\n## false pairs among the {len(hashed[names[0]])} distinct images")
    print(
        f"| method | bits always equal | mean / sd distance | smallest | pairs <= {d} | pairs <= 12 | "
        f"chance pairs <= {d - 1} / {d} / {d + 2} in 1.28M x 50k (normal fit) |\n|---|---|---|---|---|---|---|"
    )
    for n in names:
        h = np.array(hashed[n], dtype=np.uint64)
        bits = (h[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
        stuck = int((bits.min(0) == bits.max(0)).sum())
        dist = np.bitwise_count(h[:, None] ^ h[None, :])[np.triu_indices(len(h), 1)]
        mean, sd = dist.mean(), dist.std()
        chance = [pairs_1k * 0.5 * math.erfc((mean - k - 0.5) / (sd * math.sqrt(2))) for k in (d - 1, d, d + 2)]
        print(
            f"| {n} | {stuck} | {mean:.1f} / {sd:.2f} | {dist.min()} | {(dist <= d).sum()} | {(dist <= 12).sum()} | "
            + " / ".join(f"{c:.2g}" for c in chance)
            + " |"
        )


def banded(what: str, queries: np.ndarray, indexed: np.ndarray, d: int, self_join: bool, note: str) -> pd.DataFrame:
    """One near_pairs search, timed (CPU s) with the process's peak RSS, as a table row."""
    start = time.process_time()
    pairs = near_pairs(queries, indexed, d, self_join=self_join)
    seconds = time.process_time() - start
    plan = band_plan(d, len(queries), len(indexed))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"| {what}, distance {d} | {len(indexed):,} x {len(queries):,} | {plan.widths}, {plan.radius} | "
        f"{seconds:.1f} | {len(pairs)} {note} | {rss:.0f} |"
    )
    return pairs


def bench_search(train_n: int, val_n: int, planted: int, brute_rows: int) -> None:
    rng = np.random.default_rng(0)
    train = rng.integers(0, 2**64 - 1, train_n, dtype=np.uint64, endpoint=True)
    val = rng.integers(0, 2**64 - 1, val_n, dtype=np.uint64, endpoint=True)
    d, td = DEFAULT.near_duplicates_distance, DEFAULT.near_duplicates_train_distance
    for i in range(planted):
        flips = rng.choice(64, i % (d + 1), replace=False)
        val[i] = train[(i * 7919) % train_n] ^ np.uint64(sum(1 << int(b) for b in flips))
    print("\n## search: synthetic uniform fingerprints, one core")
    print("| search | size | plan (band bits, radius) | CPU s | pairs | peak RSS MB |\n|---|---|---|---|---|---|")
    pairs = banded("train x val", val, train, d, False, f"(planted {planted})")
    banded("inside train", train, train, td, True, "")
    start = time.process_time()
    for first in range(0, brute_rows, 20):  # 20 x 1.28M distances at a time (~0.2 GB)
        np.nonzero(np.bitwise_count(val[first : first + 20, None] ^ train[None, :]) <= d)
    brute = (time.process_time() - start) * val_n / brute_rows
    print(
        f"| brute force (all pairs), projected from {brute_rows} val rows | {train_n:,} x {val_n:,} | - | "
        f"{brute:.0f} | - | - |"
    )
    assert len(pairs) >= planted, "a planted near copy was missed"


def model_cost(distance: int, queries: int, indexed: int) -> float:
    """band_plan's estimate (lookups + VERIFY_COST x candidates) plus building each band's table (a sort)."""
    plan = band_plan(distance, queries, indexed)
    width, bands = max(plan.widths), len(plan.widths)
    variants = sum(math.comb(width, k) for k in range(plan.radius + 1))
    return float(bands * (queries * variants * (1 + VERIFY_COST * indexed / 2**width) + indexed * math.log2(indexed)))


def frame_bytes_per_row(rows: int = 100_000) -> float:
    """Memory of read_fingerprints' frame per row (names, wnids, shard names as Python strings), measured."""
    frame = pd.DataFrame(
        {
            "name": [f"n{k % 21000:08d}_{k}.JPEG" for k in range(rows)],
            "wnid": [f"n{k % 21000:08d}" for k in range(rows)],
            "label": np.arange(rows),
            "phash": np.arange(rows, dtype=np.uint64),
            "valid": np.ones(rows, bool),
            "shard": [f"train-h{k // 2500:016x}.parquet" for k in range(rows)],
            "row": np.arange(rows),
        }
    )
    return float(frame.memory_usage(deep=True).sum() / rows)


def bench_projection(
    train_n: int, val_n: int, target_train: int, target_val: int, fp_ms: float | None, cores: int = 16
) -> None:
    """The fingerprint and the band search measured here (uniform fingerprints, one core), projected to
    `target_train` x `target_val` images by the cost model; memory from the tables' and the frame's sizes."""
    rng = np.random.default_rng(1)
    train = rng.integers(0, 2**64 - 1, train_n, dtype=np.uint64, endpoint=True)
    val = rng.integers(0, 2**64 - 1, val_n, dtype=np.uint64, endpoint=True)
    d, td = DEFAULT.near_duplicates_distance, DEFAULT.near_duplicates_train_distance
    total = target_train + target_val
    print(f"\n## projection to {total:,} images ({target_train:,} train x {target_val:,} val), {cores} cores")
    print("| step | measured here (one core) | model x | projected CPU | projected wall, 16 cores | memory |")
    print("|---|---|---|---|---|---|")
    if fp_ms:
        cpu_h = fp_ms * total / 3.6e6
        print(
            f"| fingerprint (convert, per image) | {fp_ms:.3f} ms/img | {total:,} images | {cpu_h:.1f} CPU-h | "
            f"{cpu_h * 60 / cores:.0f} min (convert's workers) | none held (per image) |"
        )
    for what, queries, indexed, dist, self_join, tq, ti in [
        ("train x val", val, train, d, False, target_val, target_train),
        ("inside train", train, train, td, True, target_train, target_train),
    ]:
        start = time.process_time()
        near_pairs(queries, indexed, dist, self_join=self_join)
        seconds = time.process_time() - start
        scale = model_cost(dist, tq, ti) / model_cost(dist, len(queries), len(indexed))
        plan = band_plan(dist, tq, ti)
        table = (2 * 2 ** max(plan.widths) + 2 * ti) * 8  # counts + starts, rows by key + keys: one band at a time
        memory = (ti + tq) * 8 + table + CANDIDATE_BLOCK * 6 * 8
        print(
            f"| {what}, distance {dist}, plan {plan.widths}/{plan.radius} | {seconds:.1f} s at "
            f"{len(indexed):,} x {len(queries):,} | {scale:.0f} | {seconds * scale / 3600:.2f} CPU-h | "
            f"{seconds * scale / cores / 60:.1f} min if the query blocks were spread (today one process: "
            f"{seconds * scale / 60:.0f} min) | {memory / 2**30:.2f} GiB search |"
        )
    per_row = frame_bytes_per_row()
    print(
        f"| the fingerprints read (name, wnid, shard per row) | {per_row:.0f} B/row | {total:,} rows | - | - | "
        f"{per_row * total / 2**30:.1f} GiB frame |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=1_281_167)
    ap.add_argument("--val", type=int, default=50_000)
    ap.add_argument("--planted", type=int, default=500)
    ap.add_argument("--brute-rows", type=int, default=2000)
    ap.add_argument("--bases", type=int, default=200, help="base images for the planted edits")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument(
        "--project",
        type=int,
        nargs=2,
        metavar=("TRAIN", "VAL"),
        default=None,
        help="project to TRAIN x VAL images (ImageNet-21k: 12050000 950000)",
    )
    args = ap.parse_args()
    fp_ms = None
    if args.project and args.skip_quality:
        fp_ms = cpu(fingerprint, images()[1])[0]
    if not args.skip_quality:
        source, datas = images()
        print(f"# near-duplicate benchmark ({source})")
        hashed = bench_fingerprint(datas)
        bench_convert_cost(datas)
        bench_quality(datas, hashed, min(args.bases, len(datas)))
        fp_ms = cpu(fingerprint, datas)[0]
    if not args.skip_search:
        bench_search(args.train, args.val, args.planted, args.brute_rows)
    if args.project:
        target_train, target_val = args.project
        bench_projection(args.train, args.val, target_train, target_val, fp_ms)


if __name__ == "__main__":
    main()

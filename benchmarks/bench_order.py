"""Class mixing and throughput of every reader path, class-sorted vs hashed row order, in one run (issue 20).

    python -m benchmarks.bench_order [--classes 1000] [--per-class 26] [--row-group-rows 100] [--workers 2]
                                    [--batches 256,64] [--images-for-throughput 8192] [--rounds 4]

Rows used to be stored sorted by class (`convert.order: class`); convert now writes them in hashed order
(`convert.order: hashed`: sorted by `tasks.convert.plan.order_hash(name)`, so every row group is a uniform class
sample). Both readers use one epoch order (imagenet_parquet/partition.py: row groups shuffled, rows shuffled
inside windows of `window` row groups). For each reader path with its DEFAULT settings —

  * `ParquetIterableDataset(dir)` through `DataLoader(batch_size=B, num_workers=--workers)`;
  * the same with `ParquetIterableDataset(dir, batch_size=B)`;
  * `ParquetImageDataset(dir)` + `DataLoader(shuffle=True)`;
  * `ParquetImageDataset(dir)` + `DataLoader(sampler=RowGroupSampler(ds))`;

and both layouts, it prints:

  * distinct classes per batch / the uniform expectation sum_k 1-(1-p_k)^B (p_k: class frequencies; 226.4 for
    1000 equal classes and B=256), the mean over the epoch's full batches (and the worst batch);
  * label autocorrelation as P(two consecutive samples share a class) / sum_k p_k^2 (= 1/K for equal classes):
    1.0 for a uniform shuffle; over the epoch's label sequence as the loop sees it (batches of the first --batches);
  * throughput (images/s) cold (page cache of the shard files dropped with posix_fadvise DONTNEED right before
    the pass) and warm (the same pass again), decode on (draft_size=64), the same --images-for-throughput images
    per path, DataLoader workers started inside the timing; best of --rounds interleaved rounds.

Two tables of mixing: "label-only" at full ImageNet-1k scale (1,281,167 rows, 1000 classes of 732..1300 rows:
synthetic counts with ImageNet's total, minimum and maximum; shards of --sim-shard-rows rows cut into row groups of
--row-group-rows), computed from label arrays with the readers' own order functions (partition.epoch_order,
rank_positions, worker_positions) and the DataLoader's way of taking one batch from each worker in turn; and
"measured" on real shards (--classes x --per-class tiny 32x32 noise JPEGs, each made unique by a COM segment,
written with the convert stage's writer `tasks.common.shard_writer.write_shard` into shards of --sim-shard-rows rows),
read by real DataLoaders (labels of a full epoch, decode off; the "= model" column says whether the labels came
out exactly as the label-only model predicts). Writes benchmarks/_work/order/results.json; the shards under
benchmarks/_work/order/ are deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import mmap
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from PIL import Image
from torch.utils.data import DataLoader

from benchmarks.common import REPO, add_quiet_wait, cpu_seconds, evict, quiet_gate, unique_jpeg
from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.format import shard_schema
from imagenet_parquet.partition import epoch_order, rank_positions, worker_positions
from tasks.common.shard_writer import write_shard
from tasks.convert.fingerprint import fingerprint
from tasks.convert.plan import order_hash, order_rows, shard_stem

IMAGENET_TRAIN = 1_281_167  # ImageNet-1k train images; classes hold 732..1300
PATHS = {  # name -> (reader, DataLoader order)
    "iterable (defaults)": "iterable",
    "iterable (batch_size=B)": "iterable-batch",
    "map + DataLoader(shuffle=True)": "shuffle",
    "map + RowGroupSampler": "sampler",
}
LAYOUTS = ("class", "hashed")


# ---------------------------------------------------------------- pure helpers (tests/test_bench_order.py)
def uniform_expectation(counts: np.ndarray, batch: int) -> float:
    """Expected distinct classes in a batch of `batch` samples drawn uniformly (with replacement) from classes of
    `counts` rows: sum_k 1 - (1 - p_k)^B."""
    p = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    return float(np.sum(1.0 - (1.0 - p) ** batch))


def distinct_per_batch(batches: list[np.ndarray], batch: int) -> np.ndarray:
    """Distinct labels in each full batch (partial batches, at a worker's end, are left out)."""
    full = [b for b in batches if len(b) == batch]
    if not full:
        return np.zeros(0, dtype=np.int64)
    grid = np.sort(np.stack(full), axis=1)
    return np.asarray(1 + np.count_nonzero(np.diff(grid, axis=1), axis=1), dtype=np.int64)


def same_class_ratio(sequence: np.ndarray, counts: np.ndarray) -> float:
    """P(consecutive labels are equal) / sum_k p_k^2 (its value for independent uniform draws): 1.0 = no
    autocorrelation; a class-sorted stream is far above."""
    sequence = np.asarray(sequence)
    p = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    return float(np.mean(sequence[1:] == sequence[:-1]) / np.sum(p * p))


def same_class_se(length: int, counts: np.ndarray) -> float:
    """The standard error of `same_class_ratio` for a uniform shuffle of `length` samples (Poisson: the ratio
    counts ~ (length - 1)·sum p_k^2 equal pairs): how far from 1.0 noise alone moves it."""
    p = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    return float(1.0 / np.sqrt(max(1, length - 1) * np.sum(p * p)))


def imagenet_counts(classes: int = 1000, total: int = IMAGENET_TRAIN, low: int = 732, high: int = 1300) -> np.ndarray:
    """Synthetic per-class counts with ImageNet-1k's total, minimum and maximum: most classes at `high`, the
    fewest possible below it, spread evenly from `low` (the real histogram has that shape: most classes at 1300)."""
    short = next(
        n for n in range(1, classes + 1) if high * (classes - n) + np.linspace(low, high - 1, n).round().sum() <= total
    )
    counts = np.full(classes, high, dtype=np.int64)
    counts[:short] = np.linspace(low, high - 1, short).round()
    for k in range(1, short):  # what is left goes to the classes below `high` (never past it; class 0 stays `low`)
        counts[k] += min(total - int(counts.sum()), high - int(counts[k]))
    assert counts.sum() == total and counts.min() == low and counts.max() == high, counts
    return counts


def row_group_starts(shard_rows: list[int], row_group_rows: int) -> np.ndarray:
    """`ShardIndex.starts` of shards of `shard_rows` rows each cut into row groups of `row_group_rows` (the
    last group of a shard shorter)."""
    sizes = [min(row_group_rows, n - a) for n in shard_rows for a in range(0, n, row_group_rows)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def split_shards(total: int, shard_rows: int) -> list[int]:
    return [min(shard_rows, total - a) for a in range(0, total, shard_rows)]


def _round_robin(per_worker: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The DataLoader over an IterableDataset: one batch from each worker in turn, an exhausted worker skipped."""
    return [w[t] for t in range(max(map(len, per_worker), default=0)) for w in per_worker if t < len(w)]


def loader_batches(
    path: str,
    starts: np.ndarray,
    batch: int,
    workers: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    window: int = 4,
    rng: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """The global row indices of each batch a DataLoader(batch_size=`batch`, num_workers=`workers`) yields over
    one epoch of `path` (PATHS values) with the readers' default settings (seed 0, window 4, one rank)."""
    total = int(starts[-1])
    if path == "shuffle":  # RandomSampler: a uniform permutation (torch's RNG; `rng` stands in for it)
        order = (rng or np.random.default_rng()).permutation(total)
        return [order[a : a + batch] for a in range(0, total, batch)]
    order = epoch_order(starts, seed, epoch, True, window)
    positions = rank_positions(total, 0, 0, 1)
    if path == "sampler":  # the sampler's indices, cut into batches in the main process
        seq = order[positions]
        return [seq[a : a + batch] for a in range(0, total, batch)]
    chunk = batch if path == "iterable-batch" else 1
    per_worker = []
    for w in range(max(1, workers)):
        mine = order[positions[worker_positions(len(positions), chunk, w, max(1, workers))]]
        per_worker.append([mine[a : a + batch] for a in range(0, len(mine), batch)])
    return _round_robin(per_worker)


def mixing(batches_by_size: dict[int, list[np.ndarray]], counts: np.ndarray) -> dict[str, Any]:
    """Per batch size: the distinct-classes ratio (mean, and the worst full batch) of these batches of labels;
    the same-class ratio of the first batch size's label sequence (the batches in the order they came)."""
    out: dict[str, Any] = {"distinct": {}}
    for batch, batches in batches_by_size.items():
        distinct = distinct_per_batch(batches, batch)
        expect = uniform_expectation(counts, batch)
        out["distinct"][str(batch)] = {
            "mean": float(distinct.mean()),
            "uniform": expect,
            "ratio": float(distinct.mean() / expect),
            "worst_ratio": float(distinct.min() / expect),
            "batches": len(distinct),
        }
    first = next(iter(batches_by_size.values()))
    sequence = np.concatenate(first)
    out["same_class_ratio"] = same_class_ratio(sequence, counts)
    out["same_class_se"] = same_class_se(len(sequence), counts)
    return out


# ---------------------------------------------------------------- label-only model at full ImageNet scale
def label_only(args: argparse.Namespace) -> dict[str, Any]:
    counts = imagenet_counts(args.classes)
    total = int(counts.sum())
    class_labels = np.repeat(np.arange(len(counts)), counts)  # manifest order: (wnid, name)
    names = [f"n{10000000 + k:08d}_{i + 1}.JPEG" for k, n in enumerate(counts) for i in range(n)]
    hashed = order_rows(pa.table({"name": names, "row": np.arange(total)}), "hashed").column("row").to_numpy()
    starts = row_group_starts(split_shards(total, args.sim_shard_rows), args.row_group_rows)
    results: dict[str, Any] = {
        "rows": total,
        "classes": len(counts),
        "counts_min": int(counts.min()),
        "counts_max": int(counts.max()),
        "row_groups": len(starts) - 1,
        "paths": {},
    }
    for layout, labels in (("class", class_labels), ("hashed", class_labels[hashed])):
        for name, path in PATHS.items():
            rng = np.random.default_rng(1)
            batches = {
                b: [labels[i] for i in loader_batches(path, starts, b, args.workers, rng=rng)] for b in args.batches
            }
            results["paths"][f"{layout}|{name}"] = mixing(batches, counts)
    return results


# ---------------------------------------------------------------- real shards
def tiny_jpegs(classes: int, seed: int = 0) -> list[bytes]:
    """One 32x32 noise JPEG per class (re-used, each copy made unique by a COM segment)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(classes):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG", quality=85)
        out.append(buf.getvalue())
    return out


def label_map(classes: int) -> dict[str, Any]:
    return {
        "num_classes": classes,
        "label_source": "devkit",
        "classes": [
            {
                "label": k,
                "wnid": f"n{10000000 + k:08d}",
                "name": f"class {k}",
                "words": f"class {k}",
                "ilsvrc2012_id": k + 1,
            }
            for k in range(classes)
        ],
    }


def shard_rows(
    pairs: list[tuple[int, str]], lmap: dict[str, Any], bases: list[bytes], phash: list[int]
) -> Iterator[dict[str, Any]]:
    """The shard rows of (label, name) pairs: the class's tiny JPEG made unique by its name in a COM segment."""
    for label, name in pairs:
        cls = lmap["classes"][label]
        data = unique_jpeg(bases[label], name)
        yield {
            "image": {"bytes": data, "path": name},
            "label": label,
            "wnid": cls["wnid"],
            "label_name": cls["name"],
            "width": 32,
            "height": 32,
            "source_format": "JPEG",
            "transform": "none",
            "exif_orientation": 1,
            "sha256": hashlib.sha256(data).hexdigest(),
            "phash": phash[label],
        }


def build_shards(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The same rows in both layouts, written by the convert stage's writer (footer byte index included)."""
    lmap = label_map(args.classes)
    bases = tiny_jpegs(args.classes)
    phash = [fingerprint(b) for b in bases]  # the COM segment leaves the pixels (and so the fingerprint) as they are
    manifest = pa.table(
        {  # (wnid, name) order, like the manifests
            "label": np.repeat(np.arange(args.classes), args.per_class),
            "name": [f"n{10000000 + k:08d}_{i + 1}.JPEG" for k in range(args.classes) for i in range(args.per_class)],
        }
    )
    out = {}
    for layout in LAYOUTS:
        table = order_rows(manifest, layout)
        pairs = list(zip(table.column("label").to_pylist(), table.column("name").to_pylist(), strict=True))
        params = {"policy": "passthrough", "row_group_rows": args.row_group_rows, "order": layout}
        schema = shard_schema(lmap, params, "train")
        split = root / layout / "train"
        split.mkdir(parents=True, exist_ok=True)
        a = 0
        for n in split_shards(len(pairs), args.sim_shard_rows):
            label, name = pairs[a]
            stem = (
                "h" + order_hash(name).hex()[:16]
                if layout == "hashed"
                else shard_stem(lmap["classes"][label]["wnid"], name)
            )
            rows = shard_rows(pairs[a : a + n], lmap, bases, phash)
            write_shard(split / f"train-{stem}.parquet", schema, args.row_group_rows, rows)
            a += n
        out[layout] = split
    os.sync()  # written pages are dirty until flushed: DONTNEED drops clean pages only
    return out


class ToTensor:
    """PIL RGB -> uint8 CHW tensor (what a training transform ends with)."""

    def __call__(self, image: Any) -> Any:
        return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def make_loader(path: str, split: Path, batch: int, workers: int, decode: bool) -> Any:
    """The DataLoader of reader path `path` with default reader settings."""
    kw: dict[str, Any] = {"decode": decode, "draft_size": 64, "transform": ToTensor()} if decode else {"decode": False}
    if path.startswith("iterable"):
        stream = ParquetIterableDataset(split, batch_size=batch if path == "iterable-batch" else None, **kw)
        return DataLoader(stream, batch_size=batch, num_workers=workers)
    ds = ParquetImageDataset(split, **kw)
    if path == "shuffle":
        return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
    return DataLoader(ds, batch_size=batch, sampler=RowGroupSampler(ds), num_workers=workers)


def cached_fraction(files: list[Path]) -> float | None:
    """Share of the files' pages in the page cache (mincore on a read-only mapping; None where unavailable)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        resident = pages = 0
        for file in files:
            size = file.stat().st_size
            n = -(-size // mmap.PAGESIZE)
            with open(file, "rb") as fh:
                addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
                if addr in (None, ctypes.c_void_p(-1).value):
                    return None
                try:
                    vec = (ctypes.c_ubyte * n)()
                    if libc.mincore(addr, size, vec) != 0:
                        return None
                    resident += sum(v & 1 for v in vec)
                finally:
                    libc.munmap(addr, size)
            pages += n
        return resident / max(1, pages)
    except (OSError, AttributeError):
        return None


def measured(shards: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Labels of a full epoch through real DataLoaders (decode off), against the label-only model."""
    counts = np.full(args.classes, args.per_class)
    results: dict[str, Any] = {"rows": int(counts.sum()), "paths": {}}
    for layout, split in shards.items():
        ds = ParquetImageDataset(split, decode=False)
        labels, starts = ds.targets, ds.index.starts
        for name, path in PATHS.items():
            got, match = {}, True
            for batch in args.batches:
                got[batch] = [np.asarray(y) for _, y in make_loader(path, split, batch, args.workers, False)]
                if path != "shuffle":  # torch's RandomSampler draws from torch's RNG: no model to compare
                    model = loader_batches(path, starts, batch, args.workers)
                    match &= len(model) == len(got[batch]) and all(
                        np.array_equal(labels[m], g) for m, g in zip(model, got[batch], strict=False)
                    )
            seen = np.concatenate(got[args.batches[0]])
            assert np.array_equal(np.bincount(seen, minlength=args.classes), counts), (layout, name, "not one epoch")
            result = mixing(got, counts)
            result["matches_model"] = None if path == "shuffle" else bool(match)
            results["paths"][f"{layout}|{name}"] = result
            print(
                f"  measured {layout:6s} {name:32s} ratio@{args.batches[0]} "
                f"{result['distinct'][str(args.batches[0])]['ratio']:.3f}",
                flush=True,
            )
    return results


def throughput(shards: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """images/s, cold then warm (the same pass again), decode on; best of `rounds` interleaved rounds."""
    batch = args.batches[0]
    images = max(batch, args.images_for_throughput // batch * batch)
    files = {layout: sorted(split.glob("*.parquet")) for layout, split in shards.items()}
    best: dict[str, dict[str, float]] = {}
    for round_ in range(args.rounds):
        for name, path in PATHS.items():
            for layout in LAYOUTS if round_ % 2 == 0 else LAYOUTS[::-1]:
                loader = make_loader(path, shards[layout], batch, args.workers, True)
                resident: float | None = None
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        evict(files[layout])
                        resident = cached_fraction(files[layout])
                    rate, per_cpu = timed_pass(loader, images)
                    key = f"{layout}|{name}"
                    slot = best.setdefault(key, {"cold": 0.0, "warm": 0.0, "cold_per_cpu": 0.0, "warm_per_cpu": 0.0})
                    slot[cache] = max(slot[cache], rate)
                    slot[f"{cache}_per_cpu"] = max(slot[f"{cache}_per_cpu"], per_cpu)
                    if cache == "cold" and resident is not None:
                        slot["cached_after_evict"] = max(slot.get("cached_after_evict", 0.0), resident)
                    print(
                        f"  #{round_} {cache} {layout:6s} {name:32s} {rate:7.0f} img/s {per_cpu:7.0f} img/CPU-s"
                        + (
                            f" (cached after evict: {resident:.0%})" if cache == "cold" and resident is not None else ""
                        ),
                        flush=True,
                    )
    return {"images": images, "batch": batch, "paths": best}


def timed_pass(loader: Any, images: int) -> tuple[float, float]:
    """(images/s, images per CPU-second: main process + workers, robust to other users' load) of the first
    `images` images of a pass (worker start included, as in training)."""
    cpu, started, seen = cpu_seconds(), time.perf_counter(), 0
    iterator = iter(loader)
    for x, _ in iterator:
        assert x.shape[1:] == (3, 32, 32)
        seen += len(x)
        if seen >= images:
            break
    wall = time.perf_counter() - started
    del iterator  # shuts the workers down (joined: their CPU time is in RUSAGE_CHILDREN)
    assert seen == images, (seen, images)
    return seen / wall, seen / (cpu_seconds() - cpu)


# ---------------------------------------------------------------- report
def mixing_table(title: str, res: dict[str, Any], batches: list[int], model_column: bool) -> None:
    print(f"\n{title}\n")
    head = " | ".join(f"distinct/uniform B={b} (worst)" for b in batches)
    print(f"| layout | path | {head} | P(same)/Σp² (± s.e.) |" + (" = model |" if model_column else ""))
    print("|---|---|" + "---:|" * (len(batches) + 1) + ("---|" if model_column else ""))
    for key, r in res["paths"].items():
        layout, name = key.split("|")
        cells = " | ".join(
            f"{r['distinct'][str(b)]['ratio']:.3f} ({r['distinct'][str(b)]['worst_ratio']:.2f})" for b in batches
        )
        model = ""
        if model_column:
            model = " n/a |" if r["matches_model"] is None else (" yes |" if r["matches_model"] else " NO |")
        print(f"| {layout} | {name} | {cells} | {r['same_class_ratio']:.2f} (± {r['same_class_se']:.2f}) |{model}")


def throughput_table(res: dict[str, Any]) -> None:
    print(
        f"\nThroughput: {res['images']} images per pass, batch {res['batch']}, decode on (draft_size=64); "
        "best of the rounds; img/CPU-s counts the main process + workers\n"
    )
    print(
        "| cache | path | class img/s | hashed img/s | hashed/class | class img/CPU-s | hashed img/CPU-s | "
        "hashed/class | cached after evict (class, hashed) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for cache in ("cold", "warm"):
        for name in PATHS:
            c, h = res["paths"][f"class|{name}"], res["paths"][f"hashed|{name}"]
            cpu = f"{cache}_per_cpu"
            left = [r.get("cached_after_evict", float("nan")) for r in (c, h)]
            evicted = f"{left[0]:.0%}, {left[1]:.0%}" if cache == "cold" else ""
            print(
                f"| {cache} | {name} | {c[cache]:.0f} | {h[cache]:.0f} | {h[cache] / c[cache]:.2f} | {c[cpu]:.0f} | "
                f"{h[cpu]:.0f} | {h[cpu] / c[cpu]:.2f} | {evicted} |"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-class", type=int, default=26, help="images per class in the measured shards")
    parser.add_argument("--row-group-rows", type=int, default=100)
    parser.add_argument(
        "--sim-shard-rows", type=int, default=2327, help="rows per shard (256 MB shards of ~110 KB ImageNet JPEGs)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--batches",
        default="256,64",
        help="batch sizes; the first one is used for throughput and the label sequence of the autocorrelation",
    )
    parser.add_argument("--images-for-throughput", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=4, help="throughput rounds, interleaved; the best counts")
    parser.add_argument("--no-full-scale", action="store_true", help="skip the label-only ImageNet-1k table")
    parser.add_argument("--work", type=Path, default=REPO / "benchmarks" / "_work" / "order")
    parser.add_argument("--keep", action="store_true", help="keep the shards (deleted at the end by default)")
    add_quiet_wait(parser)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def measure_shards(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Write the shards of both layouts, then the measured mixing and the throughput into `results`."""
    shards_root = args.work / "shards"
    shutil.rmtree(shards_root, ignore_errors=True)
    try:
        t = time.perf_counter()
        shards = build_shards(shards_root, args)
        mb = sum(f.stat().st_size for f in sorted(shards_root.rglob("*.parquet"))) / 2e6
        starts = [ParquetImageDataset(split, decode=False).index.starts for split in shards.values()]
        results["same_row_groups"] = same = bool(np.array_equal(starts[0], starts[-1]))
        print(
            f"shards: {args.classes} x {args.per_class} rows per layout, {mb:.1f} MB each, {len(starts[0]) - 1} "
            f"row groups; the same row-group sizes in both layouts (so the same epoch order of row positions, "
            f"the same reads): {'yes' if same else 'NO'}; {time.perf_counter() - t:.1f} s",
            flush=True,
        )
        t = time.perf_counter()
        results["measured"] = measured(shards, args)
        print(f"measured mixing: {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        results["throughput"] = throughput(shards, args)
        print(f"throughput: {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(shards_root, ignore_errors=True)


def print_tables(args: argparse.Namespace, results: dict[str, Any]) -> None:
    if "label_only" in results:
        lo = results["label_only"]
        mixing_table(
            f"Label-only model, ImageNet-1k scale: {lo['rows']} rows, {lo['classes']} classes of "
            f"{lo['counts_min']}..{lo['counts_max']}, {lo['row_groups']} row groups of "
            f"{args.row_group_rows}, {args.workers} workers",
            lo,
            args.batches,
            False,
        )
    m = results["measured"]
    mixing_table(
        f"Measured, real DataLoaders ({args.workers} workers): {m['rows']} rows, {args.classes} classes x "
        f"{args.per_class}, row groups of {args.row_group_rows}",
        m,
        args.batches,
        True,
    )
    throughput_table(results["throughput"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; {quiet_gate(args.quiet_wait)}", flush=True)
    results: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    measure_shards(args, results)
    if not args.no_full_scale:
        t = time.perf_counter()
        results["label_only"] = label_only(args)
        print(f"label-only model at ImageNet-1k scale: {time.perf_counter() - t:.1f} s", flush=True)
    print_tables(args, results)
    results["seconds"] = time.perf_counter() - started
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True), encoding="utf-8")
    print(f"\n{results['seconds']:.0f} s; results: {args.work / 'results.json'}")


if __name__ == "__main__":
    main()

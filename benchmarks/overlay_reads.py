"""bench_overlay.py's reader-side subcommands (`projection`, `reader`, `mix`: see its docstring): what an
overlay costs a reader and a training run's class mix, and the size of an ImageNet-1k overlay. They read a
project bench_overlay.py `versions` built (under benchmarks/_work/overlay/<name>/), or nothing (`projection`)."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, ruled
from imagenet_parquet import ParquetIterableDataset
from imagenet_parquet.format import class_ids, read_label_map
from imagenet_parquet.overlay import overlay_table, write_overlay
from tasks.curate.stage import read_split

WORK = REPO / "benchmarks" / "_work" / "overlay"


# ------------------------------------------------------------------------------------------------ overlays
def edited_overlay(
    parquet: Path, split: str, relabel: float, exclude: float, seed: int, out: Path, contiguous: bool = False
) -> Path:
    """An overlay of `split`'s shards with a fraction of the rows relabelled (to another class) and excluded."""
    rows = read_split(parquet, split)
    classes = len(class_ids(read_label_map(parquet.parent / "label_map.json")))
    rng = np.random.default_rng(seed)
    n = len(rows.labels)
    labels, keep = rows.labels.copy(), np.ones(n, dtype=bool)
    order = rng.permutation(n)
    moved = order[: round(relabel * n)]
    labels[moved] = (labels[moved] + rng.integers(1, classes, len(moved))) % classes
    if contiguous:
        start = int(rng.integers(0, n - round(exclude * n)))
        keep[start : start + round(exclude * n)] = False
    else:
        keep[order[round(relabel * n) : round(relabel * n) + round(exclude * n)]] = False
    table = overlay_table(split, rows.shards, labels, keep, {"relabelled": len(moved), "excluded": int((~keep).sum())})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_overlay(table, out)
    return out


def cmd_projection(args: argparse.Namespace) -> None:
    """ImageNet-1k overlays before and after 10,000 relabels + 5,000 exclusions: the bytes of a new version."""
    rng = np.random.default_rng(0)
    out = WORK / "projection"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sizes = {"train": (1_281_167, 550), "val": (50_000, 25)}
    tables: dict[str, tuple[list[tuple[str, int, str]], np.ndarray]] = {}
    for split, (n, k) in sizes.items():
        counts = np.full(k, n // k)
        counts[: n % k] += 1
        shard_list = [(f"{split}-h{rng.bytes(8).hex()}.parquet", int(c), rng.bytes(32).hex()) for c in counts]
        labels = rng.integers(0, 1000, n)  # hashed order: every shard a uniform class mix
        tables[split] = (shard_list, labels)
    results = projected_versions(rng, tables, out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\nbench_overlay projection: ImageNet-1k overlays (overlay_table + write_overlay), 1000 classes at random")
    head = f"{'split':<7}{'version':<9}{'rows':>11}{'shards':>8}{'relabels':>10}{'excluded':>10}{'MB':>8}{'CPU s':>7}"
    print(ruled(head))
    for r in results:
        print(
            f"{r['split']:<7}{r['version']:<9}{r['rows']:>11,}{r['shards']:>8}{r['relabels']:>10,}"
            f"{r['exclusions']:>10,}{r['bytes'] / 1e6:>8.3f}{r['cpu_s']:>7.2f}"
        )
    new = sum(r["bytes"] for r in results if r["version"] == "v1")
    print(
        f"new bytes per version (both splits' overlays, each a new DVC object): {new / 1e6:.3f} MB "
        "(+ curation.json and the curation CSV lines in git: KB)"
    )


def projected_versions(
    rng: np.random.Generator, tables: dict[str, tuple[list[tuple[str, int, str]], np.ndarray]], out: Path
) -> list[dict[str, Any]]:
    """Each split's overlay before (v0) and after (v1) its share of the 10,000 relabels + 5,000 exclusions."""
    results: list[dict[str, Any]] = []
    edits = {"train": (10_000, 4_500), "val": (0, 500)}  # 10,000 relabels + 5,000 exclusions in all
    for split, (shard_list, labels) in tables.items():
        relabels, excludes = edits[split]
        pick = rng.permutation(len(labels))
        new_labels, keep = labels.copy(), np.ones(len(labels), dtype=bool)
        new_labels[pick[:relabels]] = (labels[pick[:relabels]] + rng.integers(1, 1000, relabels)) % 1000
        keep[pick[relabels : relabels + excludes]] = False
        for tag, lab, kp in (("v0", labels, np.ones(len(labels), dtype=bool)), ("v1", new_labels, keep)):
            cpu, start = time.process_time(), time.perf_counter()
            table = overlay_table(
                split, shard_list, lab, kp, {"relabelled": int((lab != labels).sum()), "excluded": int((~kp).sum())}
            )
            path = out / tag / f"{split}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_overlay(table, path)
            results.append(
                {
                    "split": split,
                    "version": tag,
                    "rows": len(lab),
                    "shards": len(shard_list),
                    "relabels": int((lab != labels).sum()),
                    "exclusions": int((~kp).sum()),
                    "bytes": path.stat().st_size,
                    "wall_s": time.perf_counter() - start,
                    "cpu_s": time.process_time() - cpu,
                }
            )
    return results


# ------------------------------------------------------------------------------------------------ reader
def cmd_reader(args: argparse.Namespace) -> None:
    """Warm img/s of ParquetIterableDataset with an overlay of 10 % edits vs overlay=False, alternating rounds."""
    parquet = WORK / args.name / "project" / "data" / "parquet"
    path = edited_overlay(parquet, "train", 0.05, 0.05, 0, WORK / args.name / "reader" / "overlay" / "train.parquet")
    for f in sorted((parquet / "train").glob("*.parquet")):  # warm: every shard in the page cache
        f.read_bytes()
    results, init = reader_rounds(args, parquet, path)
    rates = {k: [c / w for w, _, c in v] for k, v in results.items()}
    cpu_rates = {k: [c / u for _, u, c in v] for k, v in results.items()}
    print(
        f"\nbench_overlay reader {args.name}: ParquetIterableDataset train, decode (PIL RGB) per image, no "
        f"transform, {args.images} images per run, warm, {args.rounds} rounds alternating; overlay: 5 % "
        "relabelled + 5 % excluded at random rows"
    )
    head = f"{'reader':<22}{'img/s (wall) median':>20}{'img/CPU s median':>18}{'init s':>8}  rounds img/s"
    print(ruled(head))
    for k in ("none", "overlay"):
        print(
            f"{'overlay=False' if k == 'none' else 'overlay (10 % edits)':<22}{statistics.median(rates[k]):>20.1f}"
            f"{statistics.median(cpu_rates[k]):>18.1f}{statistics.median(init[k]):>8.3f}  "
            + " ".join(f"{x:.0f}" for x in rates[k])
        )
    ratio = statistics.median(rates["overlay"]) / statistics.median(rates["none"])
    cpu_ratio = statistics.median(cpu_rates["overlay"]) / statistics.median(cpu_rates["none"])
    paired = statistics.median(a / b for a, b in zip(rates["overlay"], rates["none"], strict=True))
    print(
        f"overlay / overlay=False: {ratio:.3f} (wall img/s medians), {paired:.3f} (median of per-round ratios), "
        f"{cpu_ratio:.3f} (img per CPU s medians)"
    )
    (WORK / args.name / "reader" / "results.json").write_text(
        json.dumps(
            {"results": results, "init": init, "ratio": ratio, "paired": paired, "cpu_ratio": cpu_ratio}, indent=1
        )
    )


def reader_rounds(
    args: argparse.Namespace, parquet: Path, path: Path
) -> tuple[dict[str, list[tuple[float, float, int]]], dict[str, list[float]]]:
    """Per reader (overlay, none): (wall s, CPU s, images) of each round, and the seconds to open the dataset."""
    results: dict[str, list[tuple[float, float, int]]] = {"overlay": [], "none": []}
    init: dict[str, list[float]] = {"overlay": [], "none": []}

    def one(kind: str, seed: int) -> None:
        start = time.perf_counter()
        ds = ParquetIterableDataset(parquet, "train", overlay=path if kind == "overlay" else False, seed=seed)
        init[kind].append(time.perf_counter() - start)
        cpu, start, count = time.process_time(), time.perf_counter(), 0
        for _ in ds:
            count += 1
            if count == args.images:
                break
        results[kind].append((time.perf_counter() - start, time.process_time() - cpu, count))

    one("overlay", 99)  # a first warm-up pass of both (not counted)
    one("none", 99)
    results = {"overlay": [], "none": []}
    for r in range(args.rounds):
        for kind in ("overlay", "none") if r % 2 == 0 else ("none", "overlay"):
            one(kind, r)
    return results, init


# ------------------------------------------------------------------------------------------------ class mix
def expected_distinct(counts: np.ndarray, batch: int) -> tuple[float, float]:
    """Expected distinct classes in `batch` draws over kept class counts: with replacement, and without (a batch
    of a perfect shuffle: hypergeometric)."""
    n = counts.sum()
    p = counts / n
    with_replacement = float((1 - (1 - p) ** batch).sum())
    j = np.arange(batch)
    absent = [
        math.exp(np.log(np.maximum(n - c - j, 1e-300) / (n - j)).sum()) if n - c >= batch else 0.0 for c in counts
    ]
    return with_replacement, float(len(counts) - sum(absent))


def cmd_mix(args: argparse.Namespace) -> None:
    """Distinct classes per batch with 10 % of the rows excluded (random rows, one run) vs uniform draws."""
    parquet = WORK / args.name / "project" / "data" / "parquet"
    batch = 256
    results = [mix_row(args, parquet, kind, batch) for kind in ("none", "random", "contiguous")]
    (WORK / args.name / "mix.json").write_text(json.dumps(results, indent=1))
    print(
        f"\nbench_overlay mix {args.name}: distinct classes per batch of {batch}, ParquetIterableDataset "
        f"(shuffle, window 4, decode=False), {args.epochs} epochs; exclusions 10 % of train rows"
    )
    head = (
        f"{'overlay':<26}{'images':>8}{'classes':>8}{'batches':>8}{'mean':>8}{'p5':>7}{'min':>6}"
        f"{'E uniform':>10}{'E shuffle':>10}{'mean/E unif':>12}{'mean/E shuf':>12}"
    )
    print(ruled(head))
    names = {"none": "none (overlay=False)", "random": "10 % excl., random rows", "contiguous": "10 % excl., one run"}
    for r in results:
        print(
            f"{names[r['overlay']]:<26}{r['images']:>8}{r['classes']:>8}{r['batches']:>8}{r['mean']:>8.1f}"
            f"{r['p5']:>7.1f}{r['min']:>6}{r['expected_with']:>10.1f}{r['expected_without']:>10.1f}"
            f"{r['mean'] / r['expected_with']:>12.3f}{r['mean'] / r['expected_without']:>12.3f}"
        )


def mix_row(args: argparse.Namespace, parquet: Path, kind: str, batch: int) -> dict[str, Any]:
    """Distinct classes per batch over `args.epochs` epochs with overlay `kind` (none, random, contiguous)."""
    overlay: Path | bool = False
    if kind != "none":
        out = WORK / args.name / "overlay" / kind / "train.parquet"
        overlay = edited_overlay(parquet, "train", 0.0, 0.10, 1, out, contiguous=kind == "contiguous")
    distinct: list[int] = []
    kept = np.zeros(0, dtype=np.int64)  # the last epoch's labels
    for epoch in range(args.epochs):
        ds = ParquetIterableDataset(parquet, "train", overlay=overlay, decode=False, batch_size=batch, seed=0)
        ds.set_epoch(epoch)
        labels = np.fromiter((label for _, label in ds), dtype=np.int64)
        full = len(labels) // batch * batch
        distinct += [len(np.unique(b)) for b in labels[:full].reshape(-1, batch)]
        kept = labels
    counts = np.bincount(kept)
    counts = counts[counts > 0]
    e_with, e_without = expected_distinct(counts, batch)
    return {
        "overlay": kind,
        "images": len(kept),
        "classes": len(counts),
        "batches": len(distinct),
        "mean": float(np.mean(distinct)),
        "min": int(np.min(distinct)),
        "p5": float(np.percentile(distinct, 5)),
        "expected_with": e_with,
        "expected_without": e_without,
    }

"""Many nodes, one copy (issue 47): what each training node fetches from a remote, node-aware order vs today's, side by
side in one run.

    python -m benchmarks.bench_nodes [--images 40000] [--classes 1000] [--nodes 4] [--ranks 2] [--canonical 64]
                                     [--throughput-images 3000] [--rounds 3] [--keep]

Label-only, at ImageNet-1k's scale (1,281,167 rows in hashed order, 1000 classes of 732..1300, shards of 2,330 rows
in row groups of 100: 13,196 groups), with the readers' own order functions: the global steps of 1, 2, 4 and 8 nodes
(x 8 ranks, a global batch of 2,048) compared (identical or not), the row groups and rows each node reads ÷ its
share, and the distinct classes per rank batch of 256 ÷ the uniform expectation — `canonical_nodes=64` beside
today's order (`canonical_nodes=None`).

Measured, over HTTP on 127.0.0.1 (tests/helpers/servers.RangeServer: one per simulated node, each counting the bytes
it sends): `--images` real JPEGs (the ../shared samples, one a class, each copy made unique by a COM segment:
ImageNet's sizes, so footers weigh what they weigh at scale) of `--classes` classes in hashed order (convert's
writer, 100-row groups, a curation overlay keeping all, a view of 10 % of the classes; `dvc push`-shaped remote),
read by `--nodes` x `--ranks` concurrent processes (`from_dvc`, decode off, one cache directory per node): bytes per
node per epoch ÷ (dataset / nodes); epoch 2 ÷ epoch 1 with a cache that holds the share; the cache on disk ÷
`cache_limit` (30 % of a node's share), sampled every 10 ms, and whether the epoch completes; classes per batch of
256 as the ranks yielded them; the view streamed on all nodes (bytes ÷ the view's image bytes); the view
materialised onto a node (`python -m imagenet_parquet.materialize`: bytes on disk ÷ the dataset's). Throughput:
`--throughput-images` real JPEGs (../shared samples, the convert stage's own code), `TrainCrop(224)` through a
DataLoader of 2 workers, one node reading its warm cache (from_dvc) vs the same shards on local disk, interleaved
rounds (img/s and img/CPU-s).
Writes benchmarks/_work/nodes/results.json."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from benchmarks.bench_order import (
    distinct_per_batch,
    imagenet_counts,
    label_map,
    row_group_starts,
    shard_rows,
    split_shards,
    tiny_jpegs,
    uniform_expectation,
)
from benchmarks.common import REPO, SAMPLES, cpu_seconds, md_table
from imagenet_parquet.cache import Cache
from imagenet_parquet.format import shard_schema, stored_label_map
from imagenet_parquet.overlay import footer_digest, footer_tail, overlay_table, read_overlay, write_overlay
from imagenet_parquet.partition import epoch_order, node_slot, partitioned_order, rank_positions
from tasks.common.shard_writer import write_shard
from tasks.convert.fingerprint import fingerprint
from tasks.convert.plan import order_hash, order_rows
from tests.helpers.http_remote import publish
from tests.helpers.servers import RangeServer

WORK = REPO / "benchmarks" / "_work" / "nodes"
FORK = multiprocessing.get_context("fork")
TOPOLOGIES = [(1, 8), (2, 8), (4, 8), (8, 8)]  # (nodes, ranks per node) of the label-only model
VIEW = "tenth"
GLOBAL_BATCH = 2048  # images of a global step: 256 a rank on 1 node of 8 ranks, 32 a rank on 8 nodes


# ---------------------------------------------------------------- label-only model at ImageNet-1k scale
def rank_rows(order: np.ndarray, nodes: int, per: int, canonical: int | None) -> list[np.ndarray]:
    """Every rank's rows of the epoch, in its order (ranks numbered node by node)."""
    world, total = nodes * per, len(order)
    slots = [r if canonical is None else node_slot(r, world, nodes, 0) for r in range(world)]
    return [order[rank_positions(total, 0, s, world)] for s in slots]


def label_only(args: argparse.Namespace) -> dict[str, Any]:
    counts = imagenet_counts(args.classes)
    total = int(counts.sum())
    names = [f"n{10000000 + k:08d}_{i + 1}.JPEG" for k, n in enumerate(counts) for i in range(n)]
    rows = order_rows(pa.table({"name": names, "row": np.arange(total)}), "hashed").column("row").to_numpy()
    labels = np.repeat(np.arange(len(counts)), counts)[rows]  # the label of each stored row
    starts = row_group_starts(split_shards(total, 2330), 100)
    units = len(starts) - 1
    out: dict[str, Any] = {"rows": total, "row_groups": units, "orders": {}}
    for name, canonical in (("today", None), (f"canonical_nodes={args.canonical}", args.canonical)):
        order = epoch_order(starts, 0, 0) if canonical is None else partitioned_order(starts, 0, 0, canonical)
        res: dict[str, Any] = {"steps_identical": True, "nodes": {}}
        reference = None
        for nodes, per in TOPOLOGIES:
            ranks = rank_rows(order, nodes, per, canonical)
            batch = 256
            steps = _step_digest(ranks, GLOBAL_BATCH // (nodes * per))  # the same global batch on every topology
            reference = reference or steps
            res["steps_identical"] &= steps == reference
            node_units = [
                np.unique(np.searchsorted(starts, np.concatenate(ranks[n * per : (n + 1) * per]), side="right") - 1)
                for n in range(nodes)
            ]
            mix = [
                distinct_per_batch([labels[r[a : a + batch]] for a in range(0, len(r), batch)], batch) for r in ranks
            ]
            res["nodes"][nodes] = {
                "groups_per_node_over_share": max(len(u) for u in node_units) / (units / nodes),
                "classes_per_batch_over_uniform": float(
                    np.concatenate(mix).mean() / uniform_expectation(counts, batch)
                ),
            }
        out["orders"][name] = res
    return out


def _step_digest(ranks: list[np.ndarray], batch: int) -> str:
    """A digest of every global step's set of rows (step t: batch t of every rank)."""
    digest = hashlib.sha256()
    for t in range(min(len(r) for r in ranks) // batch):
        digest.update(np.sort(np.concatenate([r[t * batch : (t + 1) * batch] for r in ranks])).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- the measured dataset and its remote
def build(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Shards of `--images` tiny JPEGs in hashed order (convert's writer), an overlay keeping all, the view of 10 %
    of the classes, all pushed to a directory remote the way `dvc push` lays it out; reused when there."""
    repo, store = work / "repo", work / "remote"
    info = work / "dataset.json"
    if info.exists():
        return {**json.loads(info.read_text()), "repo": repo, "store": store}
    shutil.rmtree(work, ignore_errors=True)
    lmap, per = label_map(args.classes), args.images // args.classes
    names = [f"n{10000000 + k:08d}_{i + 1}.JPEG" for k in range(args.classes) for i in range(per)]
    table = order_rows(pa.table({"label": np.repeat(np.arange(args.classes), per), "name": names}), "hashed")
    pairs = list(zip(table.column("label").to_pylist(), table.column("name").to_pylist(), strict=True))
    bases = _bases(args.classes)
    phash = [fingerprint(b) for b in bases]
    schema = shard_schema(lmap, {"policy": "passthrough", "row_group_rows": 100}, "train", curation="overlay")
    split, files, a = repo / "data" / "parquet" / "train", [], 0
    split.mkdir(parents=True)
    for n in split_shards(len(pairs), args.shard_rows):
        path = split / f"train-h{order_hash(pairs[a][1]).hex()[:16]}.parquet"
        write_shard(path, schema, 100, _rows(pairs[a : a + n], lmap, bases, phash))
        files.append(path)
        a += n
    labels = np.array([p[0] for p in pairs])
    view_rows = _overlays(repo, sorted(files), labels, lmap)
    publish(repo, store, ["data/parquet", "data/overlay", "data/views"])
    sizes = _image_sizes(sorted(files))
    facts = {
        "shard_bytes": sum(f.stat().st_size for f in files),
        "view_image_bytes": int(sizes[view_rows].sum()),
        "images": len(pairs),
    }
    info.write_text(json.dumps(facts))
    return {**facts, "repo": repo, "store": store}


def _bases(classes: int) -> list[bytes]:
    """One real ImageNet JPEG per class (../shared samples: ImageNet's sizes, ~110 KB), else tiny noise JPEGs."""
    files = sorted(SAMPLES.glob("*.JPEG"))[:classes] if SAMPLES.is_dir() else []
    if len(files) < classes:
        print(f"{SAMPLES}: fewer than {classes} sample JPEGs; tiny noise JPEGs instead (footers weigh more)")
        return tiny_jpegs(classes)
    return [f.read_bytes() for f in files]


def _rows(
    pairs: list[tuple[int, str]], lmap: dict[str, Any], bases: list[bytes], phash: list[int]
) -> Iterator[dict[str, Any]]:
    """bench_order's shard rows with each base image's own width and height."""
    sizes = {}
    for row in shard_rows(pairs, lmap, bases, phash):
        label = row["label"]
        if label not in sizes:
            sizes[label] = Image.open(io.BytesIO(bases[label])).size
        row["width"], row["height"] = sizes[label]
        yield row


def _overlays(repo: Path, files: list[Path], labels: np.ndarray, lmap: dict[str, Any]) -> np.ndarray:
    """data/overlay/train.parquet (every row kept, its label) and the view of every tenth class; the view's rows."""
    entries = [(f.name, pq.read_metadata(f).num_rows, footer_digest(footer_tail(f))) for f in files]
    keep = np.ones(len(labels), bool)
    overlay = repo / "data" / "overlay" / "train.parquet"
    overlay.parent.mkdir(parents=True)
    write_overlay(overlay_table("train", entries, labels, keep, {"relabelled": 0, "excluded": 0}), overlay)
    picked = list(range(0, len(lmap["classes"]), 10))
    vmap = {
        **lmap,
        "num_classes": len(picked),
        "classes": [{**lmap["classes"][c], "label": i} for i, c in enumerate(picked)],
    }
    vlabels = np.array([picked.index(y) if y in picked else -1 for y in labels.tolist()])
    digest = read_overlay(overlay)[0]["content_sha256"]
    extra = {
        "relabelled": 0,
        "excluded": int((vlabels < 0).sum()),
        "view": VIEW,
        "base_overlay_sha256": digest,
        "spec": json.dumps({"classes": picked}),
    }
    path = repo / "data" / "views" / VIEW / "train.parquet"
    path.parent.mkdir(parents=True)
    write_overlay(overlay_table("train", entries, vlabels, vlabels >= 0, extra, stored_label_map(vmap)), path)
    return np.flatnonzero(vlabels >= 0)


def _image_sizes(files: list[Path]) -> np.ndarray:
    from imagenet_parquet.format import decode_image_index

    sizes = []
    for f in files:
        meta = pq.read_metadata(f)
        index = decode_image_index(meta.metadata, meta.num_rows, f)
        assert index is not None
        sizes.append(index[:, 1])
    return np.concatenate(sizes)


# ---------------------------------------------------------------- simulated nodes over HTTP
def _rank(
    repo: Path, url: str, cache: Path, rank: int, world: int, per: int, epochs: int, kw: dict[str, Any], out: Any
) -> None:
    from imagenet_parquet import ParquetIterableDataset

    ds = ParquetIterableDataset.from_dvc(
        repo,
        "data/parquet/train",
        remote=url,
        cache_dir=cache,
        decode=False,
        rank=rank,
        world_size=world,
        ranks_per_node=per,
        batch_size=256,
        seed=0,
        **kw,
    )
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        labels = [label for _, label in ds]
        out.put((rank, epoch, labels))


def simulate(data: dict[str, Any], nodes: int, per: int, epochs: int, **kw: Any) -> dict[str, Any]:
    """`nodes` x `per` concurrent rank processes, node n reading through its own server and cache; per node and
    epoch the bytes its server sent; every rank's labels; the peak cache size per node (sampled every 10 ms, with
    a limit)."""
    run = WORK / f"run-{time.monotonic_ns()}"
    servers = [RangeServer(data["store"]) for _ in range(nodes)]
    out, peaks, stop = FORK.Queue(), [0] * nodes, threading.Event()
    limit = kw.get("cache_limit")

    def watch() -> None:  # with a cache_limit only: each sample holds the cache's lock (a consistent scan)
        caches = [Cache(run / f"cache{n}", 1) for n in range(nodes)]
        while limit and not stop.is_set():
            for n, c in enumerate(caches):
                peaks[n] = max(peaks[n], c.usage())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    for s in servers:
        s.__enter__()
    watcher.start()
    procs = [
        FORK.Process(
            target=_rank,
            args=(data["repo"], servers[r // per].url, run / f"cache{r // per}", r, nodes * per, per, epochs, kw, out),
        )
        for r in range(nodes * per)
    ]
    sent: dict[tuple[int, int], int] = {}
    labels: dict[tuple[int, int], list[int]] = {}
    try:
        for p in procs:
            p.start()
        for _ in range(nodes * per * epochs):
            rank, epoch, got = out.get(timeout=1800)
            labels[rank, epoch] = got
            if sum(1 for (r, e) in labels if e == epoch and r // per == rank // per) == per:
                sent[rank // per, epoch] = servers[rank // per].bytes_served  # the node's ranks are done with it
        for p in procs:
            p.join()
    finally:
        stop.set()
        watcher.join()
        for s in servers:
            s.__exit__()
        shutil.rmtree(run, ignore_errors=True)
    per_epoch = {(n, e): sent[n, e] - (sent[n, e - 1] if e else 0) for (n, e) in sent}
    return {
        "bytes": per_epoch,
        "labels": labels,
        "peaks": peaks,
        "limit": limit,
        "complete": all(p.exitcode == 0 for p in procs),
    }


def classes_ratio(labels: dict[tuple[int, int], list[int]], classes: int, images: int) -> float:
    counts = np.full(classes, images // classes)
    batches = [np.asarray(v[a : a + 256]) for v in labels.values() for a in range(0, len(v), 256)]
    return float(distinct_per_batch(batches, 256).mean() / uniform_expectation(counts, 256))


def measured(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    nodes, per, share = args.nodes, args.ranks, data["shard_bytes"] / args.nodes
    today = simulate(data, nodes, per, 1, canonical_nodes=None)
    aware = simulate(data, nodes, per, 2, canonical_nodes=args.canonical)
    small = simulate(data, nodes, per, 1, canonical_nodes=args.canonical, cache_limit=int(0.3 * share))
    view = simulate(data, nodes, per, 1, canonical_nodes=args.canonical, view=VIEW)
    view_one = simulate(data, 1, per, 1, view=VIEW)
    res = {
        "share_bytes": share,
        "per_node_over_share": {
            "today": max(today["bytes"][n, 0] for n in range(nodes)) / share,
            "node-aware": max(aware["bytes"][n, 0] for n in range(nodes)) / share,
            "node-aware, cache 30 % of share": max(small["bytes"][n, 0] for n in range(nodes)) / share,
        },
        "epoch2_over_epoch1": sum(aware["bytes"][n, 1] for n in range(nodes))
        / sum(aware["bytes"][n, 0] for n in range(nodes)),
        "cache_peak_over_limit": max(small["peaks"]) / small["limit"],
        "small_cache_complete": small["complete"] and all(len(v) for v in small["labels"].values()),
        "classes_per_batch": {
            "today": classes_ratio(today["labels"], args.classes, data["images"]),
            "node-aware": classes_ratio(
                {k: v for k, v in aware["labels"].items() if k[1] == 0}, args.classes, data["images"]
            ),
        },
        "view_bytes_over_view": {
            f"{nodes} nodes, node-aware": sum(view["bytes"].values()) / data["view_image_bytes"],
            "1 node, today": sum(view_one["bytes"].values()) / data["view_image_bytes"],
        },
    }
    res["materialized_over_dataset"] = materialized(data) / data["shard_bytes"]
    return res


def materialized(data: dict[str, Any]) -> int:
    """Bytes on disk of the view materialised from the remote onto a node."""
    from imagenet_parquet.materialize import main

    out = WORK / "materialized"
    shutil.rmtree(out, ignore_errors=True)
    with RangeServer(data["store"]) as server:
        assert (
            main(
                [
                    str(out),
                    "--repo",
                    str(data["repo"]),
                    "--remote",
                    server.url,
                    "--view",
                    VIEW,
                    "--cache-dir",
                    str(WORK / "materialize-cache"),
                ]
            )
            == 0
        )
    size = sum(p.stat().st_size for p in (out / "train").glob("*.parquet"))
    shutil.rmtree(WORK / "materialize-cache", ignore_errors=True)
    return size


# ---------------------------------------------------------------- throughput: warm node cache vs local disk
def throughput(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.bench_reader import build_folder, convert, dvc_remote, write_inputs
    from imagenet_parquet import ParquetIterableDataset, TrainCrop

    work = WORK / "throughput"
    manifests, lmap = write_inputs(work, build_folder(SAMPLES, work / "folder", args.throughput_images))
    shards = convert(work, manifests, lmap, "passthrough", None, 2)
    checkout = dvc_remote(work, shards)
    cache = work / "cache"
    with RangeServer(work / "remote") as server:

        def remote() -> Any:
            return ParquetIterableDataset.from_dvc(
                checkout,
                "data/parquet/train",
                remote=server.url,
                cache_dir=cache,
                crop=TrainCrop(224),
                seed=1,
                overlay=False,
                batch_size=64,
            )

        def local() -> Any:
            return ParquetIterableDataset(shards, "train", crop=TrainCrop(224), seed=1, overlay=False, batch_size=64)

        _epoch(remote())  # fills the cache: the measured rounds read it warm
        served = server.bytes_served
        rounds: dict[str, list[tuple[float, float]]] = {"warm node cache (from_dvc)": [], "local disk": []}
        for _ in range(args.rounds):
            rounds["local disk"].append(_epoch(local()))
            rounds["warm node cache (from_dvc)"].append(_epoch(remote()))
        assert server.bytes_served == served, "a warm round fetched from the remote"
    best = {k: max(v) for k, v in rounds.items()}
    return {
        "images": args.throughput_images,
        "rounds": rounds,
        "best": best,
        "ratio": best["warm node cache (from_dvc)"][0] / best["local disk"][0],
        "cpu_ratio": best["warm node cache (from_dvc)"][1] / best["local disk"][1],
    }


def _epoch(ds: Any) -> tuple[float, float]:
    """(images/s, images per CPU-second) of one epoch through a DataLoader of 2 workers."""
    from torch.utils.data import DataLoader

    started, cpu, seen = time.perf_counter(), cpu_seconds(), 0
    for images, _ in DataLoader(ds, batch_size=64, num_workers=2):
        seen += len(images)
    return seen / (time.perf_counter() - started), seen / (cpu_seconds() - cpu)


# ---------------------------------------------------------------- tables
def print_tables(res: dict[str, Any], args: argparse.Namespace) -> None:
    lo = res["label_only"]
    print(f"\nLabel-only, ImageNet-1k scale ({lo['rows']:,} rows, {lo['row_groups']:,} row groups; x 8 ranks a node)")
    rows = []
    for name, o in lo["orders"].items():
        for nodes, r in o["nodes"].items():
            rows.append(
                [
                    name,
                    nodes,
                    f"{r['groups_per_node_over_share']:.3f}",
                    f"{r['classes_per_batch_over_uniform']:.4f}",
                    "yes" if o["steps_identical"] else "no",
                ]
            )
    print(
        md_table(
            [
                "order",
                "nodes",
                "row groups per node ÷ share",
                "classes / batch 256 ÷ uniform",
                "same global steps on 1/2/4/8 nodes",
            ],
            rows,
        )
    )
    m = res["measured"]
    print(
        f"\nMeasured over HTTP on 127.0.0.1: {args.images:,} images, {res['dataset']['shard_bytes'] / 1e6:.0f} MB of "
        f"shards, {args.nodes} nodes x {args.ranks} ranks, canonical_nodes={args.canonical}"
    )
    table = [
        [f"bytes served per node per epoch ÷ share ({k})", f"{v:.3f}"] for k, v in m["per_node_over_share"].items()
    ]
    table += [
        ["epoch 2 bytes ÷ epoch 1 (cache holds the share)", f"{m['epoch2_over_epoch1']:.4f}"],
        ["cache on disk ÷ cache_limit, peak (limit 30 % of share)", f"{m['cache_peak_over_limit']:.3f}"],
        ["... and the epoch completed", "yes" if m["small_cache_complete"] else "NO"],
    ]
    table += [[f"classes per batch of 256 ÷ uniform ({k})", f"{v:.4f}"] for k, v in m["classes_per_batch"].items()]
    table += [
        [f"10 % view streamed: bytes served ÷ view's image bytes ({k})", f"{v:.3f}"]
        for k, v in m["view_bytes_over_view"].items()
    ]
    table += [["10 % view materialised: bytes on disk ÷ dataset", f"{m['materialized_over_dataset']:.4f}"]]
    print(md_table(["figure", "value"], table))
    if res.get("throughput"):
        print_throughput(res["throughput"], args)


def print_throughput(t: dict[str, Any], args: argparse.Namespace) -> None:
    rounds = f"best of {args.rounds} rounds (interleaved)"
    print(f"\nThroughput, {t['images']} real JPEGs, TrainCrop(224), 2 workers, {rounds}")
    print(md_table(["reader", "img/s", "img/CPU-s"], [[k, f"{v[0]:.0f}", f"{v[1]:.0f}"] for k, v in t["best"].items()]))
    print(f"warm node cache ÷ local disk: {t['ratio']:.3f} img/s, {t['cpu_ratio']:.3f} img/CPU-s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=40000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--shard-rows", type=int, default=2330, help="rows per shard (2,330: ImageNet's ~256 MB shards)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--canonical", type=int, default=64)
    p.add_argument("--throughput-images", type=int, default=3000, help="0: skip the throughput rounds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-label-only", action="store_true")
    p.add_argument("--throughput-only", action="store_true", help="only the throughput rounds (a quiet machine)")
    p.add_argument("--keep", action="store_true", help="keep benchmarks/_work/nodes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    if args.throughput_only:
        if not SAMPLES.is_dir():
            raise SystemExit(f"{SAMPLES}: not there; the throughput rounds read its real JPEGs")
        res["throughput"] = throughput(args)
        (WORK / "throughput.json").write_text(json.dumps(res, indent=1, default=str))
        return print_throughput(res["throughput"], args)
    res["label_only"] = {"rows": 0, "row_groups": 0, "orders": {}} if args.skip_label_only else label_only(args)
    data = build(WORK / "data", args)
    res["dataset"] = {k: v for k, v in data.items() if k not in ("repo", "store")}
    res["measured"] = measured(data, args)
    if args.throughput_images:
        if not SAMPLES.is_dir():
            print(f"{SAMPLES}: not there, the throughput rounds are skipped")
        else:
            res["throughput"] = throughput(args)
    (WORK / "results.json").write_text(json.dumps(res, indent=1, default=str))
    print_tables(res, args)
    if not args.keep:
        shutil.rmtree(WORK / "data", ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

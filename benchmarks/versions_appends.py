"""Issue 33's figures for `python -m benchmarks.bench_versions <appends|scale|view>`: what a version costs when
images are added (new shards of a later generation), removed from the source (overlay exclusions) or cut as a view
(a small file, no shard), and how the reader fares on them.

* `appends` (5,000 images, 50 classes, hashed order): +50 images (1 %), +1 class of 100 images whose wnid sorts
  before every other (ImageFolder's labels shift), -50 images removed from the source; per change the existing
  shards rewritten, the shards added, and the DVC cache growth (what `dvc push` sends) ÷ the dataset's shard bytes.
* `scale` (40,000 images): `dvc repro convert` after +1 % images, CPU ÷ the CPU of the full convert, same run; the
  whole command (DVC, the always-run download stage) and the convert stage alone (benchmarks/stage_probe.py).
* `view` (an ImageNet-1k-shaped set: 1000 classes): the `imagenet100` view (views stage) against a dedicated
  conversion of the same classes (`extract.classes: imagenet100`): shards written and bytes of the view; image
  bytes read per epoch ÷ the view's image bytes (local: /proc/self/io rchar; remote: bytes the loopback HTTP server
  sent to `from_dvc`); reader img per CPU-second, view ÷ dedicated (alternating rounds); then one new class of 1 %
  of the rows appended and the distinct classes per batch of 256 ÷ uniform draws.

Trees are built from ../shared/data/imagenet-samples under benchmarks/_work/versions-<cmd>/ (git-ignored)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_overlay import class_items, make_project, write_images
from benchmarks.common import (
    REPO,
    commit_push,
    cpu_seconds,
    dvc_env,
    md5s,
    proc_io,
    quiet_gate,
    run,
    shard_md5s,
    size_of,
    subreaper,
    timed,
    update_params,
)
from benchmarks.overlay_reads import expected_distinct
from benchmarks.stage_probe import probe_stages
from tasks.common.synsets import shipped_synsets
from tests.helpers.servers import isolate_prefect, prefect_server

WORK = REPO / "benchmarks" / "_work"


# ------------------------------------------------------------------------------------------------ appends
def build(base: Path, classes: list[str], counts: dict[str, int], variants: bool) -> tuple[Path, int]:
    """A folder-mode tree of `classes` x `counts` distinct images (reused when built before with the same
    arguments: tree.done records them); the next image serial."""
    tree, done = base / "tree", base / "tree.done"
    spec = json.dumps([classes, counts, variants])
    if done.is_file() and json.loads(done.read_text())["spec"] == spec:
        return tree, int(json.loads(done.read_text())["serial"])
    shutil.rmtree(tree, ignore_errors=True)
    items, serial = [], 0
    for wnid in classes:
        more, serial = class_items(wnid, counts, serial)
        items += more
    write_images(tree, items, variants)
    done.write_text(json.dumps({"spec": spec, "serial": serial}))
    return tree, serial


def change(project: Path, env: dict[str, str], name: str, cmd: list[str]) -> dict[str, Any]:
    """Run `cmd` after a change to the source, commit and push: what it cost in shards and bytes."""
    old, cache = shard_md5s(project), size_of(project / ".dvc/cache")
    wall, cpu = timed(cmd, project, env)
    new = shard_md5s(project)
    commit_push(project, env, name)
    dataset = sum(size for split in new.values() for _, size in split.values())
    grown = size_of(project / ".dvc/cache") - cache
    return {
        "change": name,
        "rewritten": {s: f"{sum(new[s].get(n) != m for n, m in old[s].items())}/{len(old[s])}" for s in old},
        "added": {s: len(set(new[s]) - set(old.get(s, {}))) for s in new},
        "added_mb": sum(new[s][n][1] for s in new for n in set(new[s]) - set(old.get(s, {}))) / 1e6,
        "cache_mb": grown / 1e6,
        "dataset_mb": dataset / 1e6,
        "new_share": grown / dataset,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def cmd_appends(args: argparse.Namespace) -> None:
    base, env = WORK / "versions-appends", dvc_env()
    subreaper()
    wnids = sorted(shipped_synsets())
    classes, first = wnids[1 : args.classes + 1], wnids[0]  # the new class sorts before all of them
    counts = {"train": args.train_per_class, "val": args.val_per_class}
    tree, serial = build(base, classes, counts, args.variants)
    rows = []
    with prefect_server(base / "prefect.log") as env["PREFECT_API_URL"]:
        project = make_project(base, tree, args, env)
        v0 = timed(["dvc", "repro"], project, env)
        commit_push(project, env, "v0")
        items = [
            class_items(w, {"train": 1}, serial + i, first=args.train_per_class)[0][0]
            for i, w in enumerate(classes[: args.add])
        ]
        (base / "tree.done").unlink()  # the tree changes from here on: rebuilt next run
        write_images(tree, items, args.variants)
        rows.append(change(project, env, f"+{len(items)} images ({len(items) / args.images:.0%})", ["dvc", "repro"]))
        items, serial = class_items(first, counts, serial + 10_000)
        write_images(tree, items, args.variants)
        rows.append(change(project, env, f"+1 class ({len(items)} images, sorts first)", ["dvc", "repro"]))
        gone = [tree / "train" / w / f"{w}_{i:05d}.JPEG" for i in range(2) for w in classes[: args.remove // 2]]
        for path in gone:
            path.unlink()
        rows.append(change(project, env, f"-{len(gone)} images removed from the source", ["dvc", "repro"]))
        relayout = compare_relayout(project, env, base, args.rounds)
    (base / "results.json").write_text(json.dumps({"v0": v0, "rows": rows, "relayout": relayout}, indent=1))
    print(
        f"\nbench_versions appends: {args.images} images, folder mode, hashed order, shard_mb {args.shard_mb}; "
        f"each change on top of the previous version: `dvc repro`, commit, `dvc push` (v0 {v0[1]:.0f} CPU s)"
    )
    print(
        "| change | train shards rewritten | val shards rewritten | shards added | added MB | cache growth MB | "
        "÷ dataset | CPU s |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['change']} | {r['rewritten']['train']} | {r['rewritten']['val']} | "
            f"{sum(r['added'].values())} | {r['added_mb']:.2f} | {r['cache_mb']:.2f} | "
            f"{100 * r['new_share']:.2f} % of {r['dataset_mb']:.0f} MB | {r['cpu_s']:.1f} |"
        )
    print_relayout(relayout)


def compare_relayout(project: Path, env: dict[str, str], base: Path, rounds: int) -> dict[str, Any]:
    """The appended layout (a copy of its shards and overlay) against `make relayout` of the same source: shards,
    bytes, and the iterable reader's decoded img per CPU-second in alternating rounds; relayout's CPU and bytes."""
    from imagenet_parquet import ParquetIterableDataset

    side = base / "appended"
    shutil.rmtree(side, ignore_errors=True)
    for name in ("parquet", "overlay"):
        shutil.copytree(project / "data" / name, side / name)
    cache = size_of(project / ".dvc/cache")
    run(["python", "-m", "tasks.convert.history", "discard"], project, env)
    wall, cpu = timed(["dvc", "repro"], project, env)
    commit_push(project, env, "relayout")
    rates: dict[str, list[float]] = {"appended": [], "relayout": []}
    roots = {"appended": side / "parquet", "relayout": project / "data/parquet"}
    for _ in range(rounds):
        for name, root in roots.items():
            rates[name].append(throughput(lambda root=root: ParquetIterableDataset(root, "train")))
    return {
        "shards": {name: len(list(root.glob("*/*.parquet"))) for name, root in roots.items()},
        "appended_shards": len(list((side / "parquet").glob("*/*-g*-*.parquet"))),
        "bytes": {name: size_of(root) for name, root in roots.items()},
        "relayout_cpu_s": cpu,
        "relayout_wall_s": wall,
        "relayout_cache_mb": (size_of(project / ".dvc/cache") - cache) / 1e6,
        "img_per_cpu_s": {k: statistics.median(v) for k, v in rates.items()},
    }


def print_relayout(r: dict[str, Any]) -> None:
    rate, mb = r["img_per_cpu_s"], {k: v / 1e6 for k, v in r["bytes"].items()}
    print(
        f"\nappended layout vs `make relayout` of the same source: shards {r['shards']['appended']} "
        f"({r['appended_shards']} appended) vs {r['shards']['relayout']}; MB {mb['appended']:.1f} vs "
        f"{mb['relayout']:.1f}; iterable reader img per CPU-s (decode, median) {rate['appended']:.0f} vs "
        f"{rate['relayout']:.0f} = {rate['appended'] / rate['relayout']:.3f}; relayout {r['relayout_cpu_s']:.0f} "
        f"CPU s, {r['relayout_cache_mb']:.1f} MB new in the DVC cache"
    )


# ------------------------------------------------------------------------------------------------ scale
def cmd_scale(args: argparse.Namespace) -> None:
    """`dvc repro convert` CPU after +1 % images ÷ the full convert's, at 40,000 images (same run)."""
    base, env = WORK / "versions-scale", dvc_env()
    subreaper()
    wnids = sorted(shipped_synsets())
    classes = wnids[: args.classes]
    tree, serial = build(base, classes, {"train": args.train_per_class, "val": args.val_per_class}, False)
    print(quiet_gate(args.quiet_wait), flush=True)
    with prefect_server(base / "prefect.log") as env["PREFECT_API_URL"]:
        project = make_project(base, tree, args, env)
        record = base / "stages.jsonl"
        record.write_text("")
        probe_stages(project, record, tree, "convert")
        run(["dvc", "repro", "extract"], project, env)
        full = timed(["dvc", "repro", "convert"], project, env)
        own = {"full": convert_cpu(record)}
        commit_push(project, env, "v0")
        add = max(1, args.images // 100)
        items = [
            class_items(
                classes[i % len(classes)], {"train": 1}, serial + i, first=args.train_per_class + i // len(classes)
            )[0][0]
            for i in range(add)
        ]
        (base / "tree.done").unlink()  # the tree changes from here on: rebuilt next run
        write_images(tree, items, False)
        run(["dvc", "repro", "extract"], project, env)
        appended = timed(["dvc", "repro", "convert"], project, env)
        own["appended"] = convert_cpu(record)
        layout = json.loads((project / "versions/layout.json").read_text())
        noop = timed(["dvc", "repro", "-f", "-s", "convert"], project, env)  # nothing new: the fixed cost
        own["noop"] = convert_cpu(record)
        stage = timed(["python", "-m", "flows.convert"], project, env)  # the stage command alone, nothing new
    result = {"images": args.images, "added": add, "full": full, "appended": appended, "noop": noop, "stage": stage}
    result["convert_stage_cpu"] = own
    (base / "results.json").write_text(json.dumps({**result, "layout": layout}, indent=1))
    print(
        f"\nbench_versions scale: {args.images} images ({size_of(tree) / 1e9:.2f} GB), +{add} images; "
        "`dvc repro convert` (extract run before each, not counted)"
    )
    print("| run | wall s | CPU s | CPU ÷ full | convert stage CPU s | ÷ full |\n|---|---:|---:|---:|---:|---:|")
    rows = (
        ("full convert", full, own["full"]),
        (f"+{add} images (1 %)", appended, own["appended"]),
        ("forced, nothing new (fixed cost)", noop, own["noop"]),
        ("`python -m flows.convert` alone, nothing new", stage, None),
    )
    for name, (wall, cpu), mine in rows:
        alone = f"{mine:.1f} | {mine / own['full']:.3f}" if mine is not None else "- | -"
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {cpu / full[1]:.3f} | {alone} |")
    fixed, add_cpu, full_cpu = own["noop"], own["appended"], own["full"]
    print(
        f"convert stage: marginal (append - fixed) ÷ (full - fixed) = {(add_cpu - fixed) / (full_cpu - fixed):.3f}; "
        "projected to 1.33 M images (+1 % = 13,300, the fixed cost once): "
        f"{(fixed + 33.3 * (add_cpu - fixed)) / (fixed + 33.3 * (full_cpu - fixed)):.3f}"
    )


def convert_cpu(record: Path) -> float:
    """CPU seconds of the convert stage's last run in `record`."""
    rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return float(rows[-1]["cpu"])


# ------------------------------------------------------------------------------------------------ view
def epoch_bytes(make: Any) -> tuple[int, int]:
    """(images, bytes read through read()/pread()) of one epoch of the dataset `make()` builds, without decoding;
    building it (footers, overlay or view) is not counted: it happens once per run, not per epoch."""
    dataset = make()
    before = proc_io()["rchar"]
    images = sum(1 for _ in dataset)
    return images, proc_io()["rchar"] - before


def throughput(make: Any) -> float:
    """Images per CPU-second of one epoch, decoded (the dataset built before the clock starts)."""
    dataset = make()
    cpu = cpu_seconds()
    images = sum(1 for _ in dataset)
    return images / max(cpu_seconds() - cpu, 1e-9)


def build_seconds(make: Any) -> float:
    """CPU seconds to build the dataset (read the footers, the overlay or view): once per run."""
    cpu = cpu_seconds()
    make()
    return cpu_seconds() - cpu


def kept_image_bytes(parquet: Path, split: str, view: str | None) -> int:
    """The image bytes of the rows the view (or the whole curated split) keeps, from the footers' byte index."""
    from imagenet_parquet import ParquetImageDataset

    ds = ParquetImageDataset(parquet, split, view=view, decode=False)
    return sum(len(ds[i][0]) for i in range(len(ds)))


def cmd_view(args: argparse.Namespace) -> None:
    from imagenet_parquet import ParquetIterableDataset

    base, env = WORK / "versions-view", dvc_env()
    subreaper()
    wnids = sorted(shipped_synsets())
    counts = {"train": args.train_per_class, "val": args.val_per_class}
    tree, serial = build(base, wnids[1 : args.classes + 1], counts, args.variants)
    views = {"imagenet100": {"classes": "imagenet100"}}
    with prefect_server(base / "prefect.log") as env["PREFECT_API_URL"]:
        project = make_project(base / "whole", tree, args, env)
        update_params(project, {"views": views})
        run(["dvc", "repro", "curate"], project, env)
        before = md5s(project / "data/parquet")
        view = timed(["dvc", "repro", "views"], project, env)
        after = md5s(project / "data/parquet")
        written = sum(after.get(n) != m for n, m in before.items()) + len(set(after) - set(before))
        dedicated = make_project(base / "dedicated", tree, args, env)
        update_params(dedicated, {"extract": {"classes": "imagenet100"}})
        run(["dvc", "repro", "curate"], dedicated, env)
    whole, own = project / "data/parquet", dedicated / "data/parquet"
    kept = kept_image_bytes(whole, "train", "imagenet100")
    images, read = epoch_bytes(lambda: ParquetIterableDataset(whole, "train", view="imagenet100", decode=False))
    rounds: dict[str, list[float]] = {"view": [], "dedicated": []}
    for _ in range(args.rounds):
        rounds["view"].append(throughput(lambda: ParquetIterableDataset(whole, "train", view="imagenet100")))
        rounds["dedicated"].append(throughput(lambda: ParquetIterableDataset(own, "train")))
    built = {
        "view": build_seconds(lambda: ParquetIterableDataset(whole, "train", view="imagenet100")),
        "dedicated": build_seconds(lambda: ParquetIterableDataset(own, "train")),
    }
    result = {
        "build_cpu_s": built,
        "view_cmd": view,
        "shards_written": written,
        "view_bytes": size_of(project / "data/views"),
        "images": images,
        "kept_bytes": kept,
        "read_bytes": read,
        "img_per_cpu_s": {k: statistics.median(v) for k, v in rounds.items()},
    }
    result["mix"] = append_mix(project, env, tree, wnids[0], serial, args)
    (base / "results.json").write_text(json.dumps(result, indent=1))
    print_view(args, result)


def append_mix(
    project: Path, env: dict[str, str], tree: Path, wnid: str, serial: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Append one class of 1 % of the train rows, `dvc repro curate`; distinct classes per batch of 256."""
    from imagenet_parquet import ParquetIterableDataset

    rows = args.classes * args.train_per_class
    items, _ = class_items(wnid, {"train": max(1, rows // 100), "val": args.val_per_class}, serial + 10_000)
    (tree.parent / "tree.done").unlink()  # the tree changes from here on: rebuilt next run
    write_images(tree, items, args.variants)
    with prefect_server(project.parent / "prefect-mix.log") as env["PREFECT_API_URL"]:
        run(["dvc", "repro", "curate"], project, env)
    distinct: list[int] = []
    labels = np.zeros(0, dtype=np.int64)
    for epoch in range(args.epochs):
        ds = ParquetIterableDataset(project / "data/parquet", "train", decode=False, seed=0)
        ds.set_epoch(epoch)
        labels = np.fromiter((label for _, label in ds), dtype=np.int64)
        full = len(labels) // 256 * 256
        distinct += [len(np.unique(b)) for b in labels[:full].reshape(-1, 256)]
    counts = np.bincount(labels)
    e_with, e_without = expected_distinct(counts[counts > 0], 256)
    return {
        "appended": max(1, rows // 100),
        "rows": len(labels),
        "mean": float(np.mean(distinct)),
        "p5": float(np.percentile(distinct, 5)),
        "min": int(np.min(distinct)),
        "expected_with": e_with,
        "expected_without": e_without,
    }


def print_view(args: argparse.Namespace, r: dict[str, Any]) -> None:
    rate = r["img_per_cpu_s"]
    mix = r["mix"]
    print(
        f"\nbench_versions view: {args.classes} classes x ({args.train_per_class} train + {args.val_per_class} "
        f"val), view imagenet100 ({r['images']} train images), {args.rounds} alternating rounds"
    )
    print("| figure | value |\n|---|---:|")
    print(f"| shards written by `dvc repro views` | {r['shards_written']} |")
    print(f"| bytes of data/views | {r['view_bytes'] / 1e6:.3f} MB |")
    print(f"| `dvc repro views` wall / CPU s | {r['view_cmd'][0]:.1f} / {r['view_cmd'][1]:.1f} |")
    print(
        f"| building the dataset, CPU s: view / dedicated | {r['build_cpu_s']['view']:.2f} / "
        f"{r['build_cpu_s']['dedicated']:.2f} |"
    )
    print(f"| bytes read per epoch ÷ the view's image bytes (local) | {r['read_bytes'] / r['kept_bytes']:.3f} |")
    print(
        f"| reader img per CPU-s, view ÷ dedicated conversion | {rate['view'] / rate['dedicated']:.3f} "
        f"({rate['view']:.0f} / {rate['dedicated']:.0f}) |"
    )
    print(
        f"| distinct classes per batch of 256 ÷ uniform, after +1 class of {mix['appended']} rows "
        f"({mix['appended'] / mix['rows']:.1%}) | {mix['mean'] / mix['expected_with']:.3f} "
        f"({mix['mean']:.1f} / {mix['expected_with']:.1f}; ÷ shuffled {mix['mean'] / mix['expected_without']:.3f}) |"
    )


def add_parsers(sub: Any) -> None:
    """The subcommands bench_versions.py dispatches here."""
    for name, func, classes, train, val, images, shard_mb in (
        ("appends", cmd_appends, 50, 90, 10, 5000, 4),
        ("scale", cmd_scale, 400, 90, 10, 40000, 4),
        # ~580 rows a shard (ImageNet at the default shard_mb 256: ~2,300); 12 train a class at 4 MB is the worst case
        ("view", cmd_view, 999, 40, 2, 41958, 64),
    ):
        p = sub.add_parser(name)
        p.set_defaults(func=func, images=images)
        p.add_argument("--classes", type=int, default=classes)
        p.add_argument("--train-per-class", type=int, default=train)
        p.add_argument("--val-per-class", type=int, default=val)
        p.add_argument("--shard-mb", type=float, default=shard_mb)
        p.add_argument("--add", type=int, default=50)
        p.add_argument("--remove", type=int, default=50)
        p.add_argument("--rounds", type=int, default=3)
        p.add_argument("--epochs", type=int, default=2)
        p.add_argument("--quiet-wait", type=float, default=0)
        p.add_argument("--no-variants", dest="variants", action="store_false")
        p.add_argument("--no-fingerprint", dest="fingerprint", action="store_false")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_versions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    args.images = args.classes * (args.train_per_class + args.val_per_class)
    isolate_prefect()
    started = time.perf_counter()
    args.func(args)
    print(f"({time.perf_counter() - started:.0f} s)")

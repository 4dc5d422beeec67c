"""What a new version costs: the hashed row order vs the class order (content-defined cuts both, issue 20), and the
size-planned layout of before issue 12 (class order), side by side.

Builds a folder-mode tree of unique real JPEGs (the 1000 samples of ../shared, each copy made unique by a JPEG
COM segment after SOI; default 50 classes x 90 train + 10 val = 5,000 images) under benchmarks/_work/versions/,
then per variant a project copy (`hashed`, `class`: `convert.order`; `size`: class order and tasks/convert/plan.py's
default layout switched in the copy) with a local DVC remote and a training node (a clone that pulled the version
before). Version 0 is `dvc repro curate` (convert, then, since issue 27, the curation overlay data/overlay that
curation edits rewrite instead of shards), committed, pushed, pulled; then each change in turn (curation files, or
the tree) is rerun, committed, pushed and pulled, and the table shows per change: shards rewritten / total per
split, MB newly stored in the DVC cache (overlay included), MB pushed, MB pulled by the node, and the rerun's wall
and CPU seconds. benchmarks/bench_overlay.py measures curation versions with the overlay through every stage.

    python -m benchmarks.bench_versions [--classes 50 --train-per-class 90 --val-per-class 10 --shard-mb 12]

Issue 33 (appends in new shards, removals as exclusions, views): `python -m benchmarks.bench_versions appends`,
`... scale`, `... view` (benchmarks/versions_appends.py says what each measures).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import versions_appends
from benchmarks.common import (
    REPO,
    SAMPLES,
    add_remote,
    commit_push,
    cpu_children,
    dvc_env,
    ruled,
    run,
    shard_md5s,
    size_of,
    unique_jpeg,
    update_params,
)
from tasks.common.synsets import shipped_synsets
from tests.helpers.project import copy_project
from tests.helpers.servers import isolate_prefect, prefect_server

VARIANTS = ("hashed", "class", "size")  # convert.order hashed / class (content layout), size layout (class order)

WORK = REPO / "benchmarks" / "_work" / "versions"
TARGETS = ["data/parquet", "data/overlay", "data/manifests", "data/label_map.json"]  # overlay: curation (issue 27)


def write_class(tree: Path, wnid: str, counts: dict[str, int], samples: list[Path], start: int) -> int:
    for split, count in counts.items():
        (tree / split / wnid).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            data = samples[(start + i) % len(samples)].read_bytes()
            (tree / split / wnid / f"{wnid}_{i:05d}.JPEG").write_bytes(unique_jpeg(data, f"{split}/{wnid}/{i}"))
        start += count
    return start


def build_tree(args: argparse.Namespace, wnids: list[str]) -> Path:
    tree = WORK / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    samples = sorted(SAMPLES.glob("*.JPEG"))
    start = 0
    for wnid in wnids[: args.classes]:
        start = write_class(tree, wnid, {"train": args.train_per_class, "val": args.val_per_class}, samples, start)
    return tree


def make_project(variant: str, tree: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[Path, Path]:
    base = WORK / variant
    shutil.rmtree(base, ignore_errors=True)
    project = copy_project(base / "project")
    if variant == "size":
        plan = project / "tasks/convert/plan.py"
        plan.write_text(plan.read_text().replace('layout: str = "content"', 'layout: str = "size"', 1))
    order = "hashed" if variant == "hashed" else "class"
    update_params(
        project,
        {"convert": {"order": order, "shard_mb": args.shard_mb}, "extract": {"mode": "folder", "folder": str(tree)}},
    )
    add_remote(project, base / "remote", env)
    repro(project, env, [])
    commit_push(project, env, "v0", TARGETS)
    node = base / "node"
    run(["git", "clone", "-q", str(project), str(node)], base, env)
    run(["dvc", "pull", *TARGETS], node, env)
    return project, node


def repro(project: Path, env: dict[str, str], first: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of `first` (a command, or []) then `dvc repro curate`."""
    cpu, start = cpu_children(), time.perf_counter()
    if first:
        run(first, project, env)
    run(["dvc", "repro", "curate"], project, env)  # convert, then the curation overlay (issue 27)
    return time.perf_counter() - start, cpu_children() - cpu


def curation_line(project: Path, kind: str, lines: list[str]) -> list[str]:
    path = project / "curation" / f"{kind}.csv"
    path.write_text(path.read_text() + "".join(line + "\n" for line in lines))
    return []


Edit = Callable[[Path], list[str]]


def changes(wnids: list[str]) -> list[tuple[str, Edit]]:
    """Each change: (name, edit(project) -> a command to run before `dvc repro curate`, or [])."""
    w = wnids
    relabel = [f"train,{w[c]},{w[c]}_{i:05d}.JPEG,{w[30]},bench" for c in (5, 6) for i in range(50)]
    one = [f"train,{w[8]},{w[8]}_00007.JPEG,{w[31]},bench"]
    val = [f"val,{w[c]},{w[c]}_{i:05d}.JPEG,bench" for c in range(10, 20) for i in range(5)]
    return [
        ("remove 1 train image", lambda p: curation_line(p, "exclude", [f"train,{w[20]},{w[20]}_00045.JPEG,bench"])),
        ("relabel 1 train image", lambda p: curation_line(p, "relabel", one)),
        ("relabel 100 images in 3 classes", lambda p: curation_line(p, "relabel", relabel)),
        ("exclude 50 val images", lambda p: curation_line(p, "exclude", val)),
        ("add 1 class", lambda p: ["dvc", "repro", "-f", "-s", "extract"]),
    ]


def measure(project: Path, node: Path, env: dict[str, str], name: str, edit: Edit) -> dict[str, Any]:
    old, cache = shard_md5s(project), size_of(project / ".dvc/cache")
    remote, node_cache = size_of(project.parent / "remote"), size_of(node / ".dvc/cache")
    wall, cpu = repro(project, env, edit(project))  # edit: the files changed; returns a command to run first
    new = shard_md5s(project)
    commit_push(project, env, name, TARGETS)
    run(["git", "pull", "-q", "--no-rebase"], node, env)
    run(["dvc", "pull", *TARGETS], node, env)
    rewritten = {s: [n for n, m in new[s].items() if old[s].get(n) != m] for s in new}
    return {
        "rewritten": {s: f"{len(rewritten[s])}/{len(new[s])}" for s in new},
        "rewritten_mb": sum(new[s][n][1] for s in new for n in rewritten[s]) / 1e6,
        "cache_mb": (size_of(project / ".dvc/cache") - cache) / 1e6,
        "pushed_mb": (size_of(project.parent / "remote") - remote) / 1e6,
        "pulled_mb": (size_of(node / ".dvc/cache") - node_cache) / 1e6,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in ("appends", "scale", "view"):
        versions_appends.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--train-per-class", type=int, default=90)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--shard-mb", type=float, default=12)
    args = parser.parse_args()
    isolate_prefect()
    wnids = sorted(shipped_synsets())
    tree = build_tree(args, wnids)
    env = dvc_env()
    rows = []
    with prefect_server(WORK / "prefect.log") as env["PREFECT_API_URL"]:
        projects = {variant: make_project(variant, tree, args, env) for variant in VARIANTS}
        for name, edit in changes(wnids):
            if name == "add 1 class":
                write_class(
                    tree,
                    wnids[args.classes],
                    {"train": args.train_per_class, "val": args.val_per_class},
                    sorted(SAMPLES.glob("*.JPEG")),
                    10**6,
                )
            for layout, (project, node) in projects.items():
                rows.append((name, layout, measure(project, node, env, name, edit)))
                print(json.dumps(rows[-1]), flush=True)  # as it comes: a long run shows progress
    images = args.classes * (args.train_per_class + args.val_per_class)
    print(
        f"\nversions: {images} images ({size_of(tree) / 1e6:.0f} MB), convert.shard_mb {args.shard_mb}; "
        "each change on top of the previous version; dvc repro curate, push, node pull"
    )
    head = (
        f"{'change':<33}{'variant':<9}{'train rewr.':>12}{'val rewr.':>10}{'rewr. MB':>10}{'cache MB':>10}"
        f"{'pushed MB':>11}"
        f"{'pulled MB':>11}{'wall s':>8}{'CPU s':>8}"
    )
    print(ruled(head))
    for name, layout, r in rows:
        print(
            f"{name:<33}{layout:<9}{r['rewritten']['train']:>12}{r['rewritten']['val']:>10}"
            f"{r['rewritten_mb']:>10.1f}{r['cache_mb']:>10.1f}"
            f"{r['pushed_mb']:>11.1f}{r['pulled_mb']:>11.1f}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}"
        )
    (WORK / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

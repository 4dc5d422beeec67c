"""What a curation version costs with merge-on-read curation (issue 27): the curate stage writes data/overlay/ and
never a shard. The measurements, each a subcommand printing its table (docs/notes/bench-versions-overlay.txt):

    python -m benchmarks.bench_overlay projection
        ImageNet-1k: a real overlay of 1,281,167 train + 50,000 val rows (imagenet_parquet.overlay.overlay_table /
        write_overlay; 550 + 25 synthetic shard names, 1000 classes, labels at random as hashed order stores them)
        before and after 10,000 relabels + 5,000 exclusions at random rows: the bytes of the new version.
    python -m benchmarks.bench_overlay versions --name sample --classes 10 --train-per-class 20 --val-per-class 5 \\
            --shard-mb 1 --relabels 20 --excludes 10
    python -m benchmarks.bench_overlay versions --name 5k --shard-mb 4 --relabels 50 --excludes 25 --add
        A folder-mode tree of real JPEGs (../shared/data/imagenet-samples, perceptually distinct variants from
        benchmarks/mirror.py so validate's near-duplicate check passes) under benchmarks/_work/overlay/<name>/, a
        project copy (tests/helpers/project.py) with a local DVC remote: v0 = `dvc repro` (every stage), committed
        and `dvc push`ed; `dvc repro` again (no-op, --noop-rounds times); then the curation edit (relabel lines:
        train images moved to the next class; exclude lines: train images and every 5th a val image), `dvc repro`,
        commit, push. Per version: shards rewritten (MD5) / total per split, MB new in the DVC cache and pushed,
        the overlay's part, and `dvc repro` wall and CPU seconds (dvc, its stages and their process pools: this
        process is their subreaper; the Prefect server the stages report to is not counted). --add then adds 1
        image to each class, then a new class (hashed order: issue 27 item 5), each its own version.
    python -m benchmarks.bench_overlay reader --name 5k [--images 1500 --rounds 5]
        Warm img/s of ParquetIterableDataset (decode included, no transform) over the train shards of <name>'s
        project with an overlay of 10 % edits (5 % relabelled, 5 % excluded, random rows, written beside under
        benchmarks/_work/overlay/<name>/reader/) vs overlay=False: same shards, alternating, median of rounds.
    python -m benchmarks.bench_overlay stages --name 5k [--rounds 2]
        The parts of a curation edit's `dvc repro` in <name>'s project, each forced alone: `dvc repro -f -s curate`,
        `dvc repro -f -s validate`, beside a no-op `dvc repro` and real edits (1 relabel line: `dvc repro`, and
        `dvc repro curate` without validate).
    python -m benchmarks.bench_overlay versions --name mix --classes 1000 --train-per-class 5 --val-per-class 1 \
            --shard-mb 4 --stage convert --no-variants --no-fingerprint --noop-rounds 0
    python -m benchmarks.bench_overlay mix --name mix [--epochs 3]
        Class mix per batch of 256 from ParquetIterableDataset (decode=False) with 10 % of the rows excluded by an
        overlay (at random rows, and as one contiguous run of rows), vs the expectation for uniform draws (with
        replacement, and a perfectly shuffled batch without replacement) over the kept labels. The shards: the
        `versions` line above (`dvc repro convert` only, no fingerprint: no validate, copies differ by a COM
        segment only).

Results also go to benchmarks/_work/overlay/<name>/results.json.
The reader-side subcommands (projection, reader, mix) live in benchmarks/overlay_reads.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import mirror
from benchmarks.common import (
    SAMPLES,
    add_remote,
    commit_push,
    dvc_env,
    md5s,
    ruled,
    shard_md5s,
    size_of,
    subreaper,
    timed,
    unique_jpeg,
    update_params,
)
from benchmarks.overlay_reads import WORK, cmd_mix, cmd_projection, cmd_reader  # the reader-side subcommands
from tasks.common.synsets import shipped_synsets
from tests.helpers.project import copy_project
from tests.helpers.servers import isolate_prefect, prefect_server


# ------------------------------------------------------------------------------------------------ the tree
def _variant(item: tuple[str, int, int, bool]) -> tuple[str, bytes]:
    dest, source, serial, variants = item
    files = sorted(SAMPLES.glob("*.JPEG"))
    path = files[source % len(files)]
    if variants:
        return dest, mirror.variant(path, source // len(files), serial)
    return dest, unique_jpeg(path.read_bytes(), f"overlay bench {serial}")


def write_images(tree: Path, items: list[tuple[str, int]], variants: bool, workers: int = 2) -> None:
    """items: (relative path, serial); serial n -> source n % 1000, round n // 1000 (mirror.variant)."""
    jobs = [(rel, n, n + 1, variants) for rel, n in items]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for rel, data in pool.imap_unordered(_variant, jobs, chunksize=32):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(data)


def class_items(wnid: str, counts: dict[str, int], start: int, first: int = 0) -> tuple[list[tuple[str, int]], int]:
    items = []
    for split, count in counts.items():
        for i in range(first, first + count):
            items.append((f"{split}/{wnid}/{wnid}_{i:05d}.JPEG", start))
            start += 1
    return items, start


# ------------------------------------------------------------------------------------------------ versions
def version(project: Path, env: dict[str, str], name: str, cmd: list[str]) -> dict[str, Any]:
    old, cache, remote = shard_md5s(project), size_of(project / ".dvc/cache"), size_of(project.parent / "remote")
    old_overlay = md5s(project / "data/overlay")
    wall, cpu = timed(cmd, project, env)
    new, new_overlay = shard_md5s(project), md5s(project / "data/overlay")
    commit_push(project, env, name)
    rewritten = {s: [n for n, m in new[s].items() if old[s].get(n) != m] for s in new}
    return {
        "change": name,
        "rewritten": {s: f"{len(rewritten[s])}/{len(new[s])}" for s in new},
        "rewritten_mb": sum(new[s][n][1] for s in new for n in rewritten[s]) / 1e6,
        "overlay_mb": sum(m[1] for f, m in new_overlay.items() if old_overlay.get(f) != m) / 1e6,
        "cache_mb": (size_of(project / ".dvc/cache") - cache) / 1e6,
        "pushed_mb": (size_of(project.parent / "remote") - remote) / 1e6,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def make_project(base: Path, tree: Path, args: argparse.Namespace, env: dict[str, str]) -> Path:
    shutil.rmtree(base / "project", ignore_errors=True)
    shutil.rmtree(base / "remote", ignore_errors=True)
    project = copy_project(base / "project")
    convert: dict[str, object] = {"order": "hashed", "shard_mb": args.shard_mb}
    if not args.fingerprint:
        convert["fingerprint"] = False
    update_params(project, {"convert": convert, "extract": {"mode": "folder", "folder": str(tree)}})
    add_remote(project, base / "remote", env)
    return project


def curation_lines(wnids: list[str], args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """relabel: train image i // classes of class i % classes -> the next class; exclude: train images from the
    end of each class, every 5th a val image."""
    k = args.classes
    relabel = [
        f"train,{wnids[i % k]},{wnids[i % k]}_{i // k:05d}.JPEG,{wnids[(i + 1) % k]},bench"
        for i in range(args.relabels)
    ]
    exclude = []
    for i in range(args.excludes):
        c = wnids[i % k]
        if i % 5 == 4:
            exclude.append(f"val,{c},{c}_{args.val_per_class - 1 - i // (5 * k):05d}.JPEG,bench")
        else:
            exclude.append(f"train,{c},{c}_{args.train_per_class - 1 - i // k:05d}.JPEG,bench")
    return relabel, exclude


def append(path: Path, lines: list[str]) -> None:
    path.write_text(path.read_text() + "".join(line + "\n" for line in lines))


def versions_tree(args: argparse.Namespace, wnids: list[str], base: Path) -> tuple[Path, int]:
    """The folder-mode tree of `versions` (built once, reused unless --rebuild) and the next image serial."""
    tree = base / "tree"
    t0 = time.perf_counter()
    if not (base / "tree.done").exists() or args.rebuild:
        shutil.rmtree(tree, ignore_errors=True)
        counts = {"train": args.train_per_class, "val": args.val_per_class}
        items, serial = [], 0
        for wnid in wnids[: args.classes]:
            more, serial = class_items(wnid, counts, serial)
            items += more
        write_images(tree, items, args.variants)
        (base / "tree.done").write_text(str(serial))
    print(f"tree: {size_of(tree) / 1e6:.0f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
    return tree, int((base / "tree.done").read_text())


def first_version(project: Path, env: dict[str, str], repro: list[str]) -> dict[str, Any]:
    """v0: `repro` in the fresh project copy, committed and pushed; its sizes, wall and CPU seconds."""
    wall, cpu = timed(repro, project, env)
    commit_push(project, env, "v0")
    return {
        "cache_mb": size_of(project / ".dvc/cache") / 1e6,
        "pushed_mb": size_of(project.parent / "remote") / 1e6,
        "shards_mb": size_of(project / "data/parquet") / 1e6,
        "wall_s": wall,
        "cpu_s": cpu,
        "shards": {s: len(v) for s, v in shard_md5s(project).items()},
    }


def added_versions(
    project: Path, env: dict[str, str], args: argparse.Namespace, wnids: list[str], serial: int, repro: list[str]
) -> tuple[list[dict[str, Any]], int]:
    """--add: 1 more image in each class, then a new class, each its own version; the next image serial."""
    tree, rows = project.parent / "tree", []
    items = []
    for wnid in wnids[: args.classes]:
        more, serial = class_items(wnid, {"train": 1}, serial, first=args.train_per_class)
        items += more
    write_images(tree, items, args.variants)
    rows.append(version(project, env, f"add {len(items)} images (1 per class)", repro))
    print(json.dumps(rows[-1]), flush=True)
    items, serial = class_items(wnids[args.classes], {"train": args.train_per_class, "val": args.val_per_class}, serial)
    write_images(tree, items, args.variants)
    rows.append(version(project, env, f"add 1 class ({len(items)} images)", repro))
    print(json.dumps(rows[-1]), flush=True)
    return rows, serial


def cmd_versions(args: argparse.Namespace) -> None:
    wnids = sorted(shipped_synsets())
    base = WORK / args.name
    env = dvc_env()
    subreaper()
    tree, serial = versions_tree(args, wnids, base)
    rows: list[dict[str, Any]] = []
    stage = [] if args.stage == "all" else [args.stage]
    repro = ["dvc", "repro", *stage]
    with prefect_server(base / "prefect.log") as env["PREFECT_API_URL"]:
        project = make_project(base, tree, args, env)
        first = first_version(project, env, repro)
        print("v0", json.dumps(first), flush=True)
        noop = [timed(repro, project, env) for _ in range(args.noop_rounds)]
        print("no-op", noop, flush=True)
        if args.stage == "convert":  # mix: shards only
            (base / "results.json").write_text(json.dumps({"first": first}, indent=1))
            return
        relabel, exclude = curation_lines(wnids, args)
        append(project / "curation/relabel.csv", relabel)
        append(project / "curation/exclude.csv", exclude)
        rows.append(version(project, env, f"{len(relabel)} relabels + {len(exclude)} exclusions", repro))
        print(json.dumps(rows[-1]), flush=True)
        if args.add:
            added, serial = added_versions(project, env, args, wnids, serial, repro)
            rows += added
        (base / "tree.done").write_text(str(serial))
    (base / "results.json").write_text(json.dumps({"first": first, "noop": noop, "rows": rows}, indent=1))
    print_versions(args, repro, first, noop, rows)


def print_versions(
    args: argparse.Namespace,
    repro: list[str],
    first: dict[str, Any],
    noop: list[tuple[float, float]],
    rows: list[dict[str, Any]],
) -> None:
    """The `versions` table: per change, what was rewritten, stored, pushed, and the rerun's cost against a no-op."""
    images = args.classes * (args.train_per_class + args.val_per_class)
    print(
        f"\nbench_overlay versions {args.name}: {images} images, folder mode, convert.order hashed, shard_mb "
        f"{args.shard_mb}; `{' '.join(repro)}`, commit, `dvc push`; each change on top of the previous version"
    )
    print(
        f"v0: {first['shards']['train']} train + {first['shards']['val']} val shards, {first['shards_mb']:.1f} MB "
        f"of shards; DVC cache {first['cache_mb']:.1f} MB; pushed {first['pushed_mb']:.1f} MB; "
        f"repro {first['wall_s']:.1f} s wall, {first['cpu_s']:.1f} CPU s"
    )
    noop_wall, noop_cpu = statistics.median(w for w, _ in noop), statistics.median(c for _, c in noop)
    print(f"no-op `{' '.join(repro)}` (median of {len(noop)}): {noop_wall:.1f} s wall, {noop_cpu:.1f} CPU s")
    head = (
        f"{'change':<36}{'train rewr.':>12}{'val rewr.':>10}{'rewr. MB':>10}{'overlay MB':>11}{'cache MB':>10}"
        f"{'pushed MB':>11}{'/ v0 push':>10}{'wall s':>8}{'CPU s':>8}{'wall/no-op':>11}{'CPU/no-op':>10}"
    )
    print(ruled(head))
    for r in rows:
        print(
            f"{r['change']:<36}{r['rewritten']['train']:>12}{r['rewritten']['val']:>10}{r['rewritten_mb']:>10.1f}"
            f"{r['overlay_mb']:>11.3f}{r['cache_mb']:>10.2f}{r['pushed_mb']:>11.2f}"
            f"{100 * r['pushed_mb'] / first['pushed_mb']:>9.2f}%{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}"
            f"{r['wall_s'] / noop_wall:>10.1f}x{r['cpu_s'] / noop_cpu:>9.1f}x"
        )


def unedited_relabel(project: Path, wnids: list[str], r: int) -> str:
    """A relabel line for a train image of class `r` that no curation line names yet (versions edits images 0-1 and
    the last ones of a class; earlier `stages` runs edit from image 10 on), so a rerun of `stages` is again an edit
    and curate never sees a duplicate line."""
    c = wnids[r]
    said = "".join((project / "curation" / f).read_text() for f in ("relabel.csv", "exclude.csv"))
    i = next(i for i in itertools.count(10) if f",{c}_{i:05d}.JPEG," not in said)
    return f"train,{c},{c}_{i:05d}.JPEG,{wnids[r + 1]},bench stages"


def cmd_stages(args: argparse.Namespace) -> None:
    """What a curation edit's `dvc repro` is made of: each stage it reruns, forced alone, and a no-op repro."""
    project, env = WORK / args.name / "project", dvc_env()
    subreaper()
    rows = []
    wnids = sorted(shipped_synsets())
    with prefect_server(WORK / args.name / "prefect-stages.log") as env["PREFECT_API_URL"]:
        for r in range(args.rounds):
            for name, cmd in (
                ("no-op dvc repro", ["dvc", "repro"]),
                ("edit: 1 relabel, dvc repro", ["dvc", "repro"]),
                ("edit: 1 relabel, repro curate", ["dvc", "repro", "curate"]),
                ("dvc repro -f -s curate", ["dvc", "repro", "-f", "-s", "curate"]),
                ("dvc repro -f -s validate", ["dvc", "repro", "-f", "-s", "validate"]),
            ):
                if name.startswith("edit"):
                    append(project / "curation/relabel.csv", [unedited_relabel(project, wnids, r)])
                rows.append((name, *timed(cmd, project, env)))
                print(rows[-1], flush=True)
    print(f"\nbench_overlay stages {args.name}: each forced alone, {args.rounds} rounds (medians)")
    head = f"{'command':<31}{'wall s':>8}{'CPU s':>8}"
    print(ruled(head))
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        print(f"{name:<31}{statistics.median(r[1] for r in mine):>8.1f}{statistics.median(r[2] for r in mine):>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("projection")
    v = sub.add_parser("versions")
    v.add_argument("--name", default="5k")
    v.add_argument("--classes", type=int, default=50)
    v.add_argument("--train-per-class", type=int, default=90)
    v.add_argument("--val-per-class", type=int, default=10)
    v.add_argument("--shard-mb", type=float, default=4)
    v.add_argument("--relabels", type=int, default=50)
    v.add_argument("--excludes", type=int, default=25)
    v.add_argument("--noop-rounds", type=int, default=2)
    v.add_argument("--stage", default="all", help="all (`dvc repro`) or a stage name")
    v.add_argument("--add", action="store_true", help="then add 1 image per class, then a class")
    v.add_argument(
        "--no-variants",
        dest="variants",
        action="store_false",
        help="copies differ by a COM segment only (validate's near-duplicate check would fail)",
    )
    v.add_argument("--no-fingerprint", dest="fingerprint", action="store_false")
    v.add_argument("--rebuild", action="store_true")
    r = sub.add_parser("reader")
    r.add_argument("--name", default="5k")
    r.add_argument("--images", type=int, default=1500)
    r.add_argument("--rounds", type=int, default=5)
    st = sub.add_parser("stages")
    st.add_argument("--name", default="5k")
    st.add_argument("--rounds", type=int, default=2)
    m = sub.add_parser("mix")
    m.add_argument("--name", default="mix")
    m.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    isolate_prefect()  # a fresh PREFECT_HOME for the server and the stages
    {
        "projection": cmd_projection,
        "versions": cmd_versions,
        "reader": cmd_reader,
        "mix": cmd_mix,
        "stages": cmd_stages,
    }[args.cmd](args)


if __name__ == "__main__":
    main()

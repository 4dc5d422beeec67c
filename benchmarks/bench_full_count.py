"""The full-count rehearsal: ImageNet-1k's real count (1,281,167 train + 50,000 val images) end to end on this
machine, beside the same chain at 40,000 images in the same run (the linear-scaling check).

For each scale it builds (once; reused) the ILSVRC2012-shaped archives of benchmarks/full_count.py under
benchmarks/_work/full-count/, copies the project (this working tree), points `download.source` at the archives
(validate's class bounds ImageNet-1k's at the full count) and runs, timing each with its CPU, peak RSS, bytes read
and written:

1. `dvc repro` from a cold page cache, each stage under benchmarks/stage_probe.py (the per-stage rows; disk
   high-water of project + archives sampled throughout);
2. a no-op `dvc repro`;
3. a curation round: 10,000 relabels + 5,000 exclusions (the same shares of train at 40,000) in curation/, then
   `dvc repro` (its ratio to the no-op);
4. `dvc push` to a local remote, and `dvc pull` into a second clone (git clone + pull);
5. in that clone, the reader: a first epoch of the iterable reader (2 DataLoader workers, TrainCrop(224): decode
   + RandomResizedCrop + flip, batch 256), its time to first batch and each worker's peak RSS; a resume from the
   middle of that epoch ({"epoch": 0, "samples_seen": n}: time to first batch, and its first batch checked equal
   to the uninterrupted epoch's); a map-style random-access pass (DataLoader shuffle, 2 workers) over
   --map-images images.

    python -m benchmarks.bench_full_count [--scales 40k,full] [--map-images 200000] [--keep]
    python -m benchmarks.bench_full_count --report      # print the tables of the saved run again

Figures land in benchmarks/_work/full-count/results.json (printed as markdown tables). The archive set takes ~6 GB,
each scale's project, remote and clone ~3x the shards."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks import full_count
from benchmarks.bench_pipeline import DiskWatch, dvc_repro, pipeline_env, prepare, project_at, stage_rows, warm_server
from benchmarks.common import (
    IO_KEYS,
    REPO,
    SAMPLES,
    add_remote,
    evict_tree,
    md_table,
    measured,
    run,
    shard_md5s,
    size_of,
    update_params,
)
from tasks.acquire import sample
from tests.helpers.project import GIT

WORK = REPO / "benchmarks" / "_work" / "full-count"
RESULTS = WORK / "results.json"
SCALES = {"40k": (39_000, 1_000), "full": (full_count.TRAIN_IMAGES, full_count.VAL_IMAGES)}
PULLED = ("data/parquet", "data/overlay", "data/label_map.json")  # what a training node pulls (trainer guide)
RELABELS, EXCLUSIONS = 10_000, 5_000  # the curation round at the full count (scaled with train below it)


def archives(train: int, val: int) -> Path:
    out = WORK / f"archives-{train}+{val}"
    if not (out / sample.MD5_TABLE).is_file():
        full_count.build(out, train, val)
    return out


def timed_repro(project: Path, env: dict[str, str], record: Path, log: Path) -> dict[str, Any]:
    """One `dvc repro` (its stages recorded afresh in `record`): totals and the stage rows."""
    record.write_text("")
    total = dvc_repro(project, env, log)
    stages = [json.loads(line) for line in record.read_text().splitlines()]
    result = {"total": total, "stages": stages}
    return {"wall": total["end"] - total["start"], "cpu": total["cpu"], "rows": stage_rows(result) if stages else []}


def cold_repro(project: Path, data: Path, env: dict[str, str], record: Path) -> dict[str, Any]:
    watch = DiskWatch([project, data], every=5.0)
    base = watch.used()
    watch.start()
    try:
        run = timed_repro(project, env, record, WORK / f"repro-{project.name}.log")
    finally:
        watch.stop.set()
        watch.join()
    shards = sum(p.stat().st_size for p in (project / "data" / "parquet").rglob("*.parquet"))
    return {**run, "disk_high": max(watch.high, watch.used()), "disk_base": base, "shards": shards}


def curation_edits(project: Path, relabels: int, exclusions: int) -> None:
    """`relabels` train images moved to another class and `exclusions` dropped (distinct, drawn with a fixed seed
    from the shards' names), written to the project's curation CSVs. Class counts stay inside validate's bounds:
    relabels are swaps (an image of class a to b, one of b to a), exclusions come from the largest classes."""
    names, wnids = [], []
    for path in sorted((project / "data" / "parquet" / "train").glob("*.parquet")):
        table = pq.ParquetFile(path).read(columns=["image.path", "wnid"], use_threads=False)
        names += [os.path.basename(p) for p in table.column("image").combine_chunks().field("path").to_pylist()]
        wnids += table.column("wnid").to_pylist()
    rng = np.random.default_rng(5)
    by_class: dict[str, list[int]] = {}
    for i in sorted(range(len(names)), key=lambda i: names[i]):
        by_class.setdefault(wnids[i], []).append(i)
    pools = {w: [int(i) for i in rng.permutation(rows)] for w, rows in sorted(by_class.items())}
    classes = sorted(pools)
    relabel: list[tuple[int, str]] = []
    for k in range(relabels // 2):  # swaps between class pairs k, k + 1 (cycling): counts unchanged
        a, b = classes[k % len(classes)], classes[(k + 1) % len(classes)]
        relabel += [(pools[a].pop(), b), (pools[b].pop(), a)]
    largest = sorted(classes, key=lambda w: (-len(by_class[w]), w))
    drop = [pools[largest[k % len(largest[:500])]].pop() for k in range(exclusions)]
    _write_csv(
        project / "curation" / "relabel.csv",
        ["split", "wnid", "name", "new_wnid", "reason"],
        sorted(["train", wnids[i], names[i], new, "rehearsal relabel"] for i, new in relabel),
    )
    _write_csv(
        project / "curation" / "exclude.csv",
        ["split", "wnid", "name", "reason"],
        sorted(["train", wnids[i], names[i], "rehearsal exclusion"] for i in drop),
    )


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(header)
        out.writerows(rows)


def cmd(project: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """Wall, CPU, peak RSS of a command in `project` (benchmarks.common.measured)."""
    return measured(list(args), project, env)


def push_pull(project: Path, env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], Path]:
    remote, clone = project.parent / f"{project.name}-remote", project.parent / f"{project.name}-clone"
    shutil.rmtree(remote, ignore_errors=True)
    shutil.rmtree(clone, ignore_errors=True)
    add_remote(project, remote, env)
    run(["git", "add", "-A"], project, env)
    run([*GIT, "commit", "-qm", "rehearsal"], project, env)
    push = cmd(project, env, sys.executable, "-m", "dvc", "push", "-q")
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    evict_tree([remote])
    pull = cmd(clone, env, sys.executable, "-m", "dvc", "pull", "-q", *PULLED)
    pull["bytes"] = sum(p.stat().st_size for p in (clone / "data").rglob("*") if p.is_file())
    return push, pull, clone


def reader(clone: Path, env: dict[str, str], map_images: int) -> dict[str, Any]:
    """The reader probe (benchmarks/full_count_reader.py) in the clone, from a cold cache."""
    evict_tree([clone / "data"])
    probe = [sys.executable, "-m", "benchmarks.full_count_reader", str(clone / "data" / "parquet"), str(map_images)]
    found = measured(probe, REPO, {**env, "PYTHONPATH": str(REPO)})
    return {**found.pop("out", {}), "process": found}


def run_scale(label: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    train, val = SCALES[label]
    data = archives(train, val)
    project = project_at(None, WORK / f"project-{label}")
    record = WORK / f"stages-{label}.jsonl"
    prepare(project, data, record)
    if label == "full":
        update_params(project, {"validate": {"train_count": [732, 1300], "val_count": [50, 50]}})
    res: dict[str, Any] = {
        "images": full_count.images(train, val),
        "archives": sum(p.stat().st_size for p in data.iterdir()),
    }
    res["server"] = warm_server(env)
    print(f"[{label}] cold dvc repro", flush=True)
    res["cold"] = cold_repro(project, data, env, record)
    res["noop"] = timed_repro(project, env, record, WORK / f"noop-{label}.log")
    share = train / full_count.TRAIN_IMAGES
    curation_edits(project, round(RELABELS * share), round(EXCLUSIONS * share))
    print(f"[{label}] curation round", flush=True)
    res["curation"] = timed_repro(project, env, record, WORK / f"curation-{label}.log")
    print(f"[{label}] push / pull", flush=True)
    res["push"], res["pull"], clone = push_pull(project, env)
    print(f"[{label}] reader", flush=True)
    res["reader"] = reader(clone, env, min(args.map_images, train))
    save(label, res)
    if label == "full":
        print(f"[{label}] append round (+1 %)", flush=True)
        res["append"] = append_round(project, data, env, record)
        save(label, res)
    if not args.keep:
        for path in (project, clone, project.parent / f"{project.name}-remote"):  # (--keep: --only-append reuses them)
            shutil.rmtree(path, ignore_errors=True)
    return res


def append_round(project: Path, data: Path, env: dict[str, str], record: Path) -> dict[str, Any]:
    """The next release with 1 % more train images (benchmarks/full_count.appended) through `dvc repro` in the
    project of the full run, then `dvc push`: what was rewritten, added and pushed."""
    grown = WORK / f"{data.name}+1pct"
    if not (grown / sample.MD5_TABLE).is_file():
        full_count.appended(data, grown)
    high = max(round(c * 1.01) for c in full_count.class_counts(full_count.TRAIN_IMAGES))
    update_params(
        project,
        {
            "download": {"source": str(grown)},
            "verify": {"checksums": str(grown / sample.MD5_TABLE)},
            "validate": {"train_count": [732, high]},
        },
    )
    before = shard_md5s(project)
    run = timed_repro(project, env, record, WORK / "append-full.log")
    after = shard_md5s(project)
    rewritten = sum(after[s].get(name) != v for s in before for name, v in before[s].items())
    added = [v for s in after for name, v in after[s].items() if name not in before[s]]
    remote = project.parent / f"{project.name}-remote"
    pushed_before = size_of(remote)
    push = cmd(project, env, sys.executable, "-m", "dvc", "push", "-q")
    return {
        **run,
        "rewritten": int(rewritten),
        "old_shards": sum(len(v) for v in before.values()),
        "added_shards": len(added),
        "new_bytes": sum(size for _, size in added),
        "total_bytes": sum(size for v in after.values() for _, size in v.values()),
        "pushed_bytes": size_of(remote) - pushed_before,
        "push": push,
        "changes": json.loads((project / "versions" / "changes.json").read_text()),
    }


def save(label: str, res: dict[str, Any]) -> None:
    saved = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    saved[label] = res
    RESULTS.write_text(json.dumps(saved, indent=1))


# ---------------------------------------------------------------- tables
def stage_table(saved: dict[str, Any]) -> str:
    full, small = saved.get("full"), saved.get("40k")
    big = full or small
    assert big is not None
    rows = []
    small_rows: dict[str, Any] = dict(small["cold"]["rows"]) if small and full else {}
    for name, r in big["cold"]["rows"]:
        per = r["cpu"] / big["images"] * 1e3
        s = small_rows.get(name)
        ratio = f"{per / (s['cpu'] / small['images'] * 1e3):.2f}" if small and s and s["cpu"] > 0 else "-"
        rows.append(
            (
                name,
                f"{r['wall']:.1f}",
                f"{r['cpu']:.1f}",
                f"{r.get('maxrss', 0) / 1e6:.0f}",
                f"{r['read_bytes'] / 1e6:.0f}",
                f"{r['write_bytes'] / 1e6:.0f}",
                f"{per:.3f}",
                ratio,
            )
        )
    head = ["step", "wall s", "CPU s", "peak RSS MB", "disk read MB", "written MB", "CPU ms/image", "÷ 40k"]
    title = f"\n### cold `dvc repro`, {big['images']:,} images, archives {big['archives'] / 1e9:.2f} GB\n\n"
    return title + md_table(head, rows)


def summary_table(saved: dict[str, Any]) -> str:
    head = ["figure", *saved]
    runs = list(saved.values())

    def row(name: str, fn: Callable[[dict[str, Any]], str]) -> tuple[str, ...]:
        return (name, *(fn(r) for r in runs))

    rows = [
        row("images", lambda r: f"{r['images']:,}"),
        row(
            "cold dvc repro: wall min / CPU min",
            lambda r: f"{r['cold']['wall'] / 60:.1f} / {r['cold']['cpu'] / 60:.1f}",
        ),
        row(
            "peak RSS of any stage, MB", lambda r: f"{max(x.get('maxrss', 0) for _, x in r['cold']['rows']) / 1e6:.0f}"
        ),
        row("disk high-water (archives + project), GB", lambda r: f"{r['cold']['disk_high'] / 1e9:.1f}"),
        row("shards, GB", lambda r: f"{r['cold']['shards'] / 1e9:.2f}"),
        row("no-op dvc repro: wall s / CPU s", lambda r: f"{r['noop']['wall']:.1f} / {r['noop']['cpu']:.1f}"),
        row("curation round: wall s / CPU s", lambda r: f"{r['curation']['wall']:.1f} / {r['curation']['cpu']:.1f}"),
        row("curation round ÷ no-op (wall)", lambda r: f"{r['curation']['wall'] / r['noop']['wall']:.2f}"),
        row("dvc push: wall s / peak RSS MB", lambda r: f"{r['push']['wall']:.0f} / {r['push']['rss_mb']:.0f}"),
        row(
            "dvc pull (2nd clone): wall s / peak RSS MB",
            lambda r: f"{r['pull']['wall']:.0f} / {r['pull']['rss_mb']:.0f}",
        ),
    ]
    rows += reader_rows(runs)
    return "\n### the rehearsal\n\n" + md_table(head, rows)


def reader_rows(runs: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    keys: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("iterable epoch: images, img/s", lambda d: f"{d['iter']['images']:,}, {d['iter']['rate']:.0f}"),
        ("iterable: time to first batch s", lambda d: f"{d['iter']['first']:.2f}"),
        ("iterable: peak RSS (USS) per worker MB", lambda d: _rss(d["iter"])),
        ("resume mid-epoch: first batch s; equal", lambda d: f"{d['resume']['first']:.2f}; {d['resume']['equal']}"),
        ("map-style: images, img/s", lambda d: f"{d['map']['images']:,}, {d['map']['rate']:.0f}"),
        ("map-style: time to first batch s", lambda d: f"{d['map']['first']:.2f}"),
        ("map-style: peak RSS (USS) per worker MB", lambda d: _rss(d["map"])),
        ("reader main process peak RSS MB", lambda d: f"{d['main_rss_mb']:.0f}"),
        (
            "baseline: a worker of a null dataset, peak RSS (USS) MB",
            lambda d: _rss(d["floor"]) if "floor" in d else "-",
        ),
    ]
    return [(name, *(fn(r["reader"]) if "iter" in r["reader"] else "-" for r in runs)) for name, fn in keys]


def append_table(saved: dict[str, Any]) -> str:
    full = saved.get("full", {})
    if "append" not in full:
        return ""
    a = full["append"]
    stage = dict(a["rows"])
    cold = dict(full["cold"]["rows"])
    changes = a["changes"].get("train", {})
    rows = [
        (
            "train in changes.json: images added; shards rewritten",
            f"{changes.get('images_added')}; {changes.get('shards_rewritten')}",
        ),
        ("dvc repro: wall min / CPU min", f"{a['wall'] / 60:.1f} / {a['cpu'] / 60:.1f}"),
        ("... of which convert: wall s / CPU s", f"{stage['convert']['wall']:.0f} / {stage['convert']['cpu']:.0f}"),
        ("convert CPU ÷ the cold run's convert CPU", f"{stage['convert']['cpu'] / cold['convert']['cpu']:.3f}"),
        ("existing shards rewritten", f"{a['rewritten']} of {a['old_shards']}"),
        (
            "shards added; their bytes ÷ all shards",
            f"{a['added_shards']}; {100 * a['new_bytes'] / a['total_bytes']:.2f} %",
        ),
        ("dvc push afterwards: MB sent, wall s", f"{a['pushed_bytes'] / 1e6:.1f}, {a['push']['wall']:.0f}"),
    ]
    rows += [
        (f"stage {name}: wall s / CPU s", f"{r['wall']:.0f} / {r['cpu']:.0f}")
        for name, r in a["rows"]
        if ":" not in name
    ]
    return "\n### append round: +1 % train images, full count\n\n" + md_table(["figure", "value"], rows)


def _rss(found: dict[str, Any]) -> str:
    return f"{found['worker_rss_mb']:.0f} ({found.get('worker_uss_mb', 0):.0f})"


def print_tables(saved: dict[str, Any]) -> None:
    print(stage_table(saved))
    print(summary_table(saved))
    print(append_table(saved))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="40k,full", help="comma-separated, of " + ", ".join(SCALES))
    parser.add_argument("--map-images", type=int, default=200_000, help="images of the map-style random pass")
    parser.add_argument("--keep", action="store_true", help="keep each scale's project, remote and clone")
    parser.add_argument("--report", action="store_true", help="print the saved run's tables again")
    parser.add_argument("--only-append", action="store_true", help="the append round alone, in the kept full project")
    args = parser.parse_args()
    if args.only_append:
        saved = json.loads(RESULTS.read_text())["full"]
        project, data = WORK / "project-full", archives(*SCALES["full"])
        saved["append"] = append_round(project, data, pipeline_env(), WORK / "stages-full.jsonl")
        save("full", saved)
    elif not args.report:
        if not SAMPLES.is_dir():
            raise SystemExit(f"{SAMPLES}: expected the folder of real ImageNet JPEGs, found nothing")
        WORK.mkdir(parents=True, exist_ok=True)
        env = pipeline_env()
        for label in args.scales.split(","):
            run_scale(label, env, args)
    print_tables(json.loads(RESULTS.read_text()))
    print(f"\n(raw figures: {RESULTS}; IO keys {', '.join(IO_KEYS)})")


if __name__ == "__main__":
    main()

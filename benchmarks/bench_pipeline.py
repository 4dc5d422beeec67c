"""Benchmark the whole chain at scale: `dvc repro` end to end on an ILSVRC2012-shaped mirror of N real images.

Builds a mirror of N unique real-image variants (the JPEGs of ../shared/data/imagenet-samples, cycled; each round
of a file rolled, inverted and flipped differently and re-encoded like the source, plus a unique JPEG COM segment
after SOI, benchmarks/mirror.py: unique bytes so leakage stays 0, phash fingerprints >= 10 bits apart so validate's
near-duplicate search sees what real ImageNet gives it, not ~40 copies of every picture, and sizes stay realistic;
about 96 % train, 4 % val as in ILSVRC2012) under benchmarks/_work/pipeline/ (built in 2 processes), then in a
fresh copy of the project (this working tree, and with --baseline-rev an older commit, side by side) points
`download.source` at it and runs `dvc repro` with the project's own validate params (no near-duplicates by
design: `near_duplicates_max_pairs` is left as it is). `--check-mirror` fingerprints a mirror's images instead
and prints the near-duplicate pairs validate would find.

Each stage command runs under a small wrapper (benchmarks/stage_probe.py) that drops the page cache of the
mirror and the project's data (posix_fadvise DONTNEED: a cold cache, as for a dataset larger than RAM) and
records the stage's process tree: wall, CPU, bytes read from disk / through read(), bytes written, peak RSS of
its largest process, and DVC's own CPU and I/O between stages. A thread samples the disk used by the project
and the mirror (every inode once) for the high-water mark. `md5sum` and `cp` of the same archives are timed cold
in the same run. Prints markdown tables and a projection to ImageNet-1k (1,331,167 images) for 2 and 16 cores.

    python -m benchmarks.bench_pipeline --images 40000 [--fixed-images 4000] [--baseline-rev REV] [--keep]
        [--variant convert.order=class]   # also this tree with a params override, side by side
    python -m benchmarks.bench_pipeline --report benchmarks/_work/pipeline-results.json   # print a saved run again
    python -m benchmarks.bench_pipeline --images 4000 --check-mirror [DIR]   # the mirror's near-duplicate pairs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks import mirror as variants
from benchmarks.common import (
    IO_KEYS,
    REPO,
    SAMPLES,
    add_quiet_wait,
    cpu_children,
    cpu_seconds,
    evict_tree,
    proc_io,
    quiet_gate,
)
from benchmarks.stage_probe import probe_stages
from tasks.acquire import sample
from tasks.common import ARCHIVES
from tests.helpers.project import copy_project
from tests.helpers.servers import isolate_prefect

WORK = REPO / "benchmarks" / "_work" / "pipeline"
RESULTS = REPO / "benchmarks" / "_work" / "pipeline-results.json"
IMAGENET_IMAGES = 1_331_167  # ILSVRC2012 train + val
Refs = dict[str, dict[str, Any]]  # md5sum / cp of the archives: name -> figures


def build_mirror(images: int) -> tuple[Path, int]:
    """The mirror (built once, reused with --keep) and its number of images."""
    classes = min(1000, max(2, images // 100))
    val = max(1, round(0.038 * images / classes))
    train = images // classes - val
    out = WORK / f"mirror-v{variants.VERSION}-{classes}x{train}+{val}"
    if not (out / sample.MD5_TABLE).exists():
        shutil.rmtree(out, ignore_errors=True)
        start, cpu = time.perf_counter(), cpu_seconds()
        with variants.variant_images(workers=min(2, len(os.sched_getaffinity(0)))) as source:
            sample.write_sample(
                out, classes=classes, train_per_class=train, val_per_class=val, real_images=SAMPLES, image_source=source
            )
        print(
            f"mirror {out.name}: built in {time.perf_counter() - start:.0f} s wall, {cpu_seconds() - cpu:.0f} CPU s",
            flush=True,
        )
    return out, classes * (train + val)


# ---------------------------------------------------------------- the projects
def project_at(rev: str | None, dest: Path) -> Path:
    """A fresh git repo holding this working tree (rev None) or the tree of an older commit."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if rev is None:
        return copy_project(dest)
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@127.0.0.1", "commit", "-qm", rev], cwd=dest, check=True
    )
    return dest


def prepare(project: Path, mirror: Path, record: Path, overrides: dict[str, str] | None = None) -> None:
    (project / "dvc.lock").unlink(missing_ok=True)
    params = yaml.safe_load((project / "params.yaml").read_text())
    for key, value in (overrides or {}).items():  # --variant: section.key=value (a YAML value)
        section, name = key.split(".", 1)
        params[section][name] = yaml.safe_load(value)
    params["download"]["source"] = str(mirror)
    params["verify"]["checksums"] = str(mirror / sample.MD5_TABLE)
    params["validate"]["train_count"] = [1, 1300]
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    probe_stages(project, record, mirror)


class DiskWatch(threading.Thread):
    """Bytes allocated under roots (every inode once), sampled every `every` s; `high` is the maximum."""

    def __init__(self, roots: list[Path], every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.roots, self.every, self.stop, self.high = roots, every, threading.Event(), 0

    def used(self) -> int:
        seen: dict[tuple[int, int], int] = {}
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    try:
                        st = os.lstat(os.path.join(dirpath, name))
                    except OSError:
                        continue
                    seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        return sum(seen.values())

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.high = max(self.high, self.used())


def warm_server(env: dict[str, str]) -> dict[str, float]:
    """Start (or find) the run's shared Prefect server before `dvc repro` (tasks/common/prefect_server.py), so its
    start (~5-20 s, once per pipeline run) is not charged to whichever stage happens to come first in whichever
    variant runs first: the keeper then serves every run of every variant alike. Returns its wall and CPU."""
    code = "from tasks.common.prefect_server import shared_server\nwith shared_server():\n    pass\n"
    cpu, start = cpu_children(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return {"wall": time.perf_counter() - start, "cpu": cpu_children() - cpu}


def dvc_repro(project: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    before, cpu, start = proc_io(), cpu_children(), time.time()
    with open(log, "wb") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "dvc", "repro"], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    end, after, cpu = time.time(), proc_io(), cpu_children() - cpu
    if rc:
        raise SystemExit(f"dvc repro failed (rc {rc}) in {project}; its output:\n{log.read_text()[-4000:]}")
    return {"start": start, "end": end, "cpu": cpu, **{k: after[k] - before[k] for k in IO_KEYS}}


def timed_cold(cmd: list[str], mirror: Path) -> dict[str, Any]:
    evict_tree([mirror])
    before, cpu, start = proc_io(), cpu_children(), time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall, after, cpu = time.perf_counter() - start, proc_io(), cpu_children() - cpu
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"wall": wall, "cpu": cpu, "maxrss": maxrss, **{k: after[k] - before[k] for k in IO_KEYS}}


def reference_rows(mirror: Path) -> dict[str, dict[str, Any]]:
    """`md5sum` and `cp` (+ fsync) of the three archives, each from a cold cache."""
    files = [str(mirror / name) for name in ARCHIVES.values()]
    copy = Path(tempfile.mkdtemp(prefix="cp-", dir=WORK))
    try:
        md5 = timed_cold(["md5sum", *files], mirror)
        cp = timed_cold(["sh", "-c", f'cp "$@" {copy}/ && sync -f {copy}/*', "cp", *files], mirror)
    finally:
        shutil.rmtree(copy)
    return {"md5sum of the archives": md5, "cp of the archives": cp}


# ---------------------------------------------------------------- one run and its rows
def run_variant(
    label: str, rev: str | None, mirror: Path, env: dict[str, str], overrides: dict[str, str] | None = None
) -> dict[str, Any]:
    project = project_at(rev, WORK / f"project-{label}")
    record = WORK / f"stages-{label}.jsonl"
    record.unlink(missing_ok=True)
    prepare(project, mirror, record, overrides)
    server = warm_server(env)
    watch = DiskWatch([project, mirror])
    base = watch.used()
    watch.start()
    try:
        total = dvc_repro(project, env, WORK / f"repro-{label}.log")
    finally:
        watch.stop.set()
        watch.join()
    high = max(watch.high, watch.used())
    stages = [json.loads(line) for line in record.read_text().splitlines()]
    shards = sum(p.stat().st_size for p in (project / "data" / "parquet").rglob("*.parquet"))
    shutil.rmtree(project)
    return {"stages": stages, "total": total, "disk_high": high, "disk_base": base, "shards": shards, "server": server}


def stage_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One row per stage and one per DVC gap (DVC's own CPU and I/O, read from its /proc between stages)."""
    rows: list[tuple[str, dict[str, Any]]] = []
    total, stages = result["total"], result["stages"]
    prev_end, prev_dvc, prev_name = total["start"], {"cpu": 0.0, **dict.fromkeys(IO_KEYS, 0)}, "start"
    prev_io = dict.fromkeys(IO_KEYS, 0)
    for st in stages:
        dvc = st["dvc_before"] or prev_dvc
        gap = {
            "wall": st["start"] - prev_end,
            "cpu": dvc["cpu"] - prev_dvc["cpu"],
            "maxrss": 0,
            **{k: dvc[k] - prev_dvc[k] - prev_io[k] for k in IO_KEYS},
        }
        rows.append((f"dvc: {prev_name} -> {st['stage']}", gap))
        rows.append((st["stage"], {"wall": st["end"] - st["start"], **st}))
        prev_end, prev_dvc, prev_name = st["end"], st["dvc_after"] or dvc, st["stage"]
        prev_io = {k: st.get("folded", st)[k] for k in IO_KEYS}
    keys = ("cpu", *IO_KEYS)  # DVC's last stretch: all it was charged, less the stages and the earlier stretches
    folded = {k: sum(st.get("folded", st)[k] for st in stages) for k in keys}
    gaps = {k: sum(r[k] for n, r in rows if n.startswith("dvc:")) for k in keys}
    last = {"wall": total["end"] - prev_end, "maxrss": 0, **{k: total[k] - folded[k] - gaps[k] for k in keys}}
    rows.append((f"dvc: {prev_name} -> end", last))
    return rows


def marginal(big: dict[str, Any], small: dict[str, Any] | None, key: str, frac: float) -> float:
    """The per-image part of a figure: (big - small) / (1 - frac), frac = small images / big images; the whole
    figure when no small run was made."""
    if small is None:
        return float(big[key])
    return max(0.0, float(big[key] - small[key]) / (1 - frac))


def project_wall(
    big: dict[str, Any], small: dict[str, Any] | None, frac: float, scale: float, cores: int, have: int
) -> float:
    """Minutes for ImageNet-1k: the fixed part (the small run, minus its per-image share) plus the per-image part
    scaled by `scale` (ImageNet-1k images / big images), on `cores` by Amdahl with the parallel fraction implied
    by the per-image part's CPU/wall on the `have` cores of this machine."""
    per_image = marginal(big, small, "wall", frac)
    fixed = max(0.0, float(big["wall"]) - per_image)
    use = marginal(big, small, "cpu", frac) / per_image if per_image > 0 else 1.0
    par = min(1.0, max(0.0, have / (have - 1) * (1 - 1 / max(use, 1e-9)))) if have > 1 else 0.0
    serial = per_image * scale / ((1 - par) + par / have)
    return (fixed + serial * ((1 - par) + par / cores)) / 60


def fmt_row(
    name: str, r: dict[str, Any], small: dict[str, Any] | None, fit: tuple[float, float, float], have: int
) -> str:
    frac, scale, data = fit
    proj2, proj16 = (project_wall(r, small, frac, scale, c, have) for c in (2, 16))
    use = r["cpu"] / r["wall"] if r["wall"] > 0 else 0
    reads, writes = (marginal(r, small, k, frac) / data for k in ("rchar", "wchar"))
    return (
        f"| {name} | {r['wall']:.1f} | {r['cpu']:.1f} | {use:.2f} | {r['read_bytes'] / 1e6:.0f} | "
        f"{reads:.2f} | {r['write_bytes'] / 1e6:.0f} | {writes:.2f} | {r.get('maxrss', 0) / 1e6:.0f} | "
        f"{proj2:.1f} | {proj16:.1f} | {project_cpu(r, small, frac, scale):.1f} |"
    )


def project_cpu(big: dict[str, Any], small: dict[str, Any] | None, frac: float, scale: float) -> float:
    """CPU minutes for ImageNet-1k (fixed + per-image part scaled): the figure a busy machine does not bend."""
    per_image = marginal(big, small, "cpu", frac)
    return (max(0.0, float(big["cpu"]) - per_image) + per_image * scale) / 60


def table(label: str, runs: dict[str, dict[str, Any]], refs: dict[str, dict[str, Any]], have: int) -> str:
    big, small = runs["big"], runs.get("small")
    images, data = big["images"], big["data"]
    frac = small["images"] / images if small else 0.0
    fit = (frac, IMAGENET_IMAGES / images, data * (1 - frac))
    rows = stage_rows(big)
    small_rows = dict(stage_rows(small)) if small else {}
    total = {k: sum(r[k] for _, r in rows) for k in ("wall", "cpu", *IO_KEYS)}
    small_total = {k: sum(r[k] for r in small_rows.values()) for k in total} if small else None
    total["maxrss"] = max(r["maxrss"] for _, r in rows)
    fixed = f", fixed cost from a {small['images']:,}-image run" if small else ""
    lines = [
        f"\n### {label}: `dvc repro`, {images:,} images, archives {data / 1e9:.2f} GB, {have} CPUs{fixed}\n",
        (
            "| step | wall s | CPU s | CPU/wall | disk read MB | read() passes | written MB | write passes "
            "| peak RSS MB | ImageNet-1k min, 2 cores | 16 cores | CPU min |"
        ),
        "|---|" + "---:|" * 11,
    ]
    lines += [fmt_row(n, r, small_rows.get(n), fit, have) for n, r in rows]
    lines.append(fmt_row("**whole dvc repro**", total, small_total, fit, have))
    lines += [fmt_row(n, r, None, (0.0, fit[1], data), have) for n, r in refs.items()]
    p2, p16 = (sum(project_wall(r, small_rows.get(n), frac, fit[1], c, have) for n, r in rows) for c in (2, 16))
    m2, m16 = (project_wall(refs["md5sum of the archives"], None, 0.0, fit[1], c, have) for c in (2, 16))
    cpu = sum(project_cpu(r, small_rows.get(n), frac, fit[1]) for n, r in rows)
    md5_cpu = project_cpu(refs["md5sum of the archives"], None, 0.0, fit[1])
    high, shards = big["disk_high"], big["shards"]
    dvc_cpu = sum(r["cpu"] for n, r in rows if n.startswith("dvc:"))
    reads, writes = (marginal(total, small_total, k, frac) / fit[2] for k in ("rchar", "wchar"))
    lines += [
        "",
        "| figure | value |",
        "|---|---:|",
        f"| whole dvc repro / md5sum of the archives, 2 cores (projected) | {p2 / m2:.2f}x |",
        f"| whole dvc repro / md5sum of the archives, 16 cores (projected) | {p16 / m16:.2f}x |",
        f"| whole dvc repro / md5sum of the archives, CPU (projected) | {cpu / md5_cpu:.2f}x |",
        (f"| disk high-water (archives + project) | {high / 1e9:.2f} GB (+{(high - big['disk_base']) / 1e9:.2f}) |"),
        f"| disk high-water / (archives + shards) | {high / (data + shards):.2f} |",
        f"| read() passes / write passes over the image bytes (per-image part) | {reads:.2f} / {writes:.2f} |",
        f"| DVC's own share of all CPU | {100 * dvc_cpu / total['cpu']:.0f} % |",
    ]
    if "server" in big:  # runs saved before warm_server have none
        lines.append(
            f"| Prefect server start or reuse before the run, not in the rows above (once per pipeline run) "
            f"| {big['server']['wall']:.1f} s wall, {big['server']['cpu']:.1f} CPU s |"
        )
    return "\n".join(lines)


def compare_stage(results: dict[str, dict[str, dict[str, Any]]], stage: str) -> str:
    """One stage of every variant beside the first one's (same mirror, same run): wall, CPU, read() passes."""
    first = next(iter(results))
    rows = {label: dict(stage_rows(runs["big"]))[stage] for label, runs in results.items()}
    data = results[first]["big"]["data"]
    lines = [
        f"\n### {stage}, each variant beside `{first}` (the {results[first]['big']['images']:,}-image run)\n",
        "| variant | wall s | ÷ first | CPU s | ÷ first | read() passes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = rows[first]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['wall']:.1f} | {r['wall'] / base['wall']:.2f} | {r['cpu']:.1f} | "
            f"{r['cpu'] / base['cpu']:.2f} | {r['rchar'] / data:.2f} |"
        )
    return "\n".join(lines)


def check_mirror(given: Path | None, images: int, keep: bool) -> None:
    """--check-mirror: the near-duplicate figures of a mirror (given, or the --images one, built here)."""
    if given is not None and not (given / ARCHIVES["train"]).is_file():
        raise SystemExit(f"{given}: expected a mirror folder holding {ARCHIVES['train']}, found none")
    WORK.mkdir(parents=True, exist_ok=True)
    mirror = given or build_mirror(images)[0]
    sources = sum(1 for p in SAMPLES.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    try:
        print(variants.check_table(f"{mirror.name}: phash near-duplicates", variants.check_mirror(mirror, sources)))
    finally:
        if given is None and not keep:
            shutil.rmtree(mirror)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000, help="images in the mirror (train + val)")
    parser.add_argument(
        "--fixed-images",
        type=int,
        default=None,
        help="a second, smaller mirror whose run gives the fixed cost of each step (0: none; default "
        "images / 10, at least 200: large enough that both runs take the same code paths)",
    )
    parser.add_argument("--baseline-rev", default=None, help="also run this git revision on the same mirrors")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="also run this tree with a params.yaml override (repeatable: one variant each), e.g. convert.order=class",
    )
    parser.add_argument("--keep", action="store_true", help="keep the mirrors under benchmarks/_work/pipeline")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a saved run (RESULTS) again")
    parser.add_argument(
        "--check-mirror",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="fingerprint every image of the mirror at DIR (default: the --images mirror, built "
        "here) and print its near-duplicate pairs instead of running the pipeline",
    )
    add_quiet_wait(parser)
    return parser.parse_args()


def pipeline_env() -> dict[str, str]:
    """The environment of every `dvc repro`: a fresh PREFECT_HOME, no Prefect server of the caller's, this
    interpreter's bin/ first on PATH."""
    isolate_prefect()  # a fresh PREFECT_HOME for every stage (before anything imports prefect)
    # the stages import the project copy's code, as `dvc repro` does for a user: no PYTHONPATH into a checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PYTHONPATH")}
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")  # a fresh database migrates first
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def run_all(args: argparse.Namespace, env: dict[str, str]) -> tuple[dict[str, dict[str, dict[str, Any]]], Refs]:
    """Every variant on the big mirror (and the small one): label -> "big"/"small" -> run; the reference rows."""
    if args.fixed_images is None:
        args.fixed_images = max(200, args.images // 10)
    sizes = {"big": args.images, **({"small": args.fixed_images} if 0 < args.fixed_images < args.images else {})}
    variants: dict[str, tuple[str | None, dict[str, str]]] = {"this tree": (None, {})}
    variants |= {f"this tree, {v}": (None, dict([v.split("=", 1)])) for v in args.variant}
    if args.baseline_rev:
        variants[f"baseline {args.baseline_rev}"] = (args.baseline_rev, {})
    results: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in variants}
    refs: Refs = {}
    try:
        for size, count in sizes.items():
            mirror, images = build_mirror(count)
            for label, (rev, overrides) in variants.items():
                run = run_variant(re.sub(r"\W+", "-", label), rev, mirror, env, overrides)
                run["images"] = images
                run["data"] = sum((mirror / name).stat().st_size for name in ARCHIVES.values())
                results[label][size] = run
            if size == "big":
                refs = reference_rows(mirror)
            if not args.keep:
                shutil.rmtree(mirror)
    finally:
        if not args.keep:
            shutil.rmtree(WORK, ignore_errors=True)
    return results, refs


def print_tables(results: dict[str, dict[str, dict[str, Any]]], refs: Refs, cpus: int) -> None:
    for label, runs in results.items():
        print(table(label, runs, refs, cpus))
    print(compare_stage(results, "convert"))


def main() -> None:
    args = parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        print_tables(saved["results"], saved["refs"], saved["cpus"])
        return
    if not SAMPLES.is_dir():
        raise SystemExit(f"{SAMPLES}: expected the folder of real ImageNet JPEGs, found nothing")
    if args.check_mirror is not None:
        check_mirror(Path(args.check_mirror) if args.check_mirror else None, args.images, args.keep)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    have = len(os.sched_getaffinity(0))
    print(quiet_gate(args.quiet_wait), flush=True)
    results, refs = run_all(args, pipeline_env())
    RESULTS.write_text(json.dumps({"results": results, "refs": refs, "cpus": have}, indent=1))
    print_tables(results, refs, have)
    print(f"\n(raw figures: {RESULTS}; print again with --report {RESULTS})")


if __name__ == "__main__":
    main()

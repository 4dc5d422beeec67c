"""Benchmark the extract stage: an index into the archives vs a materialized ImageFolder tree.

Builds ILSVRC2012-shaped archives from replicated real JPEGs of ../shared (default 100 classes x 50 train +
10 val = 6,000 images) under benchmarks/_work/extract/, then in a fresh copy of the project per variant runs
`dvc repro -s extract` (first run) and again (no-op, best of 5), and prints wall times, bytes and files written.
Variants: `index` (materialize: false), `materialize` (tree written, not a DVC out: what we ship), and
`materialize+tracked` (the rejected alternative: the tree declared as a `cache: false` out).

    python -m benchmarks.bench_extract [--classes 100 --train-per-class 50 --val-per-class 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import SAMPLES, dvc_env, ruled, timed, update_params
from benchmarks.common import WORK as BENCH_WORK
from tasks.acquire.sample import write_sample
from tasks.common.layout import ARCHIVES, SPLITS
from tasks.extract import materialize as imagefolder
from tasks.extract import stage as extract
from tests.helpers.project import copy_project  # the tests' project copy
from tests.helpers.servers import isolate_prefect, prefect_server

WORK = BENCH_WORK / "extract"
REPRO = [sys.executable, "-m", "dvc", "repro", "-s", "extract"]
VARIANTS = ("index", "materialize", "materialize+tracked")


def build_archives(args: argparse.Namespace) -> Path:
    out = WORK / "archives"
    spec = {"classes": args.classes, "train_per_class": args.train_per_class, "val_per_class": args.val_per_class}
    stamp = out / "spec.json"
    if not stamp.exists() or json.loads(stamp.read_text()) != spec:
        shutil.rmtree(out, ignore_errors=True)
        write_sample(out, real_images=SAMPLES, **spec)
        stamp.write_text(json.dumps(spec))
    return out


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """relative path → (size, mtime_ns) of every file under root except the linked archives."""
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not path.is_symlink():
                st = path.stat()
                found[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return found


def make_project(variant: str, archives: Path) -> Path:
    project = WORK / variant
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    copy_project(project)
    update_params(project, {"extract": {"materialize": variant != "index"}})
    if variant == "materialize+tracked":
        dvc = (project / "dvc.yaml").read_text()
        dvc = dvc.replace(
            "      - ${paths.label_map}\n",
            "      - ${paths.label_map}\n      - ${paths.work}/imagefolder: {cache: false}\n",
            1,
        )
        (project / "dvc.yaml").write_text(dvc)
    raw = project / "data" / "raw"
    raw.mkdir(parents=True)
    md5s = dict(line.split("\t") for line in (archives / "sample_md5.tsv").read_text().splitlines()[1:])
    for name in ARCHIVES.values():
        (raw / name).symlink_to(archives / name)
    verify = {
        "archives": {
            n: {"md5": m, "expected": m, "bytes": (archives / n).stat().st_size, "ok": True} for n, m in md5s.items()
        },
        "checksums": "sample",
    }
    (raw / "verify.json").write_text(json.dumps(verify, indent=2, sort_keys=True) + "\n")
    return project


def in_process(archives: Path, out: Path, materialize: bool) -> float:
    """The stage's own work (scan + manifests [+ tree]) without Prefect/DVC overhead."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    for split in SPLITS:
        extract.scan_archive_split(split, archives / ARCHIVES[split], out / "staging", root=out)
    extract.finalize(
        out / "staging", out / "manifests", out / "label_map.json", devkit_path=archives / ARCHIVES["devkit"]
    )
    if materialize:
        imagefolder.materialize(out / "manifests", out / "imagefolder", root=out)
    return time.perf_counter() - start


def measure(variant: str, archives: Path, env: dict[str, str]) -> dict[str, float]:
    project = make_project(variant, archives)
    before = snapshot(project)
    first, _ = timed(REPRO, project, env)  # (wall s, CPU s of DVC and its children: the steadier figure)
    after = snapshot(project)
    changed = [p for p, v in after.items() if before.get(p) != v]
    noops = [timed(REPRO, project, env) for _ in range(5)]
    work = in_process(archives, WORK / "inproc", materialize=variant != "index")
    return {
        "work_s": work,
        "first_s": first,
        "bytes": sum(after[p][0] for p in changed),
        "files": len(changed),
        "noop_s": min(w for w, _ in noops),
        "noop_cpu_s": min(c for _, c in noops),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--train-per-class", type=int, default=50)
    parser.add_argument("--val-per-class", type=int, default=10)
    args = parser.parse_args()
    archives = build_archives(args)
    images = args.classes * (args.train_per_class + args.val_per_class)
    size = sum((archives / n).stat().st_size for n in ARCHIVES.values())
    isolate_prefect()  # the tests' isolated PREFECT_HOME, inherited by the server and every stage
    env = dvc_env()
    with prefect_server(WORK / "prefect.log") as env["PREFECT_API_URL"]:
        results = {variant: measure(variant, archives, env) for variant in VARIANTS}
    print(f"\nextract: {images} images, archives {size / 1e6:.0f} MB; dvc repro -s extract in a fresh project copy")
    head = (
        f"{'variant':<21}{'work s':>8}{'x':>6}{'repro s':>9}{'MB written':>12}{'files':>7}"
        f"{'no-op wall s':>14}{'no-op CPU s':>13}{'x':>6}"
    )
    print(ruled(head))
    base = results["index"]
    for variant, r in results.items():
        print(
            f"{variant:<21}{r['work_s']:>8.2f}{r['work_s'] / base['work_s']:>6.1f}{r['first_s']:>9.1f}"
            f"{r['bytes'] / 1e6:>12.1f}{r['files']:>7}{r['noop_s']:>14.2f}{r['noop_cpu_s']:>13.2f}"
            f"{r['noop_cpu_s'] / base['noop_cpu_s']:>6.2f}"
        )


if __name__ == "__main__":
    main()

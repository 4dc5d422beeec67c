"""Benchmark the extract stage: an index into the archives vs a materialized ImageFolder tree.

Builds ILSVRC2012-shaped archives from replicated real JPEGs of ../shared (default 100 classes x 50 train +
10 val = 6,000 images) under benchmarks/_work/extract/, then in a fresh copy of the project per variant runs
`dvc repro -s extract` (first run) and again (no-op, best of 5), and prints wall times, bytes and files written.
Variants: `index` (materialize: false), `materialize` (tree written, not a DVC out: what we ship), and
`materialize+tracked` (the rejected alternative: the tree declared as a `cache: false` out).

    python benchmarks/bench_extract.py [--classes 100 --train-per-class 50 --val-per-class 10]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers.project import copy_project  # noqa: E402  (the tests' project copy)
from tests.helpers.servers import free_port, isolate_prefect, wait_http  # noqa: E402

isolate_prefect()  # the tests' isolated PREFECT_HOME (before anything imports prefect)

from tasks.extract import materialize as imagefolder, stage as extract  # noqa: E402
from tasks.common import ARCHIVES  # noqa: E402
from tasks.acquire.sample import write_sample  # noqa: E402

WORK = REPO / "benchmarks" / "_work" / "extract"
SAMPLES = REPO.parent / "shared" / "data" / "imagenet-samples"
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
    found = {}
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
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["extract"]["materialize"] = variant != "index"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if variant == "materialize+tracked":
        dvc = (project / "dvc.yaml").read_text()
        dvc = dvc.replace("      - ${paths.label_map}\n", "      - ${paths.label_map}\n"
                          "      - ${paths.work}/imagefolder: {cache: false}\n", 1)
        (project / "dvc.yaml").write_text(dvc)
    raw = project / "data" / "raw"
    raw.mkdir(parents=True)
    md5s = dict(line.split("\t") for line in (archives / "sample_md5.tsv").read_text().splitlines()[1:])
    for name in ARCHIVES.values():
        (raw / name).symlink_to(archives / name)
    verify = {"archives": {n: {"md5": m, "expected": m, "bytes": (archives / n).stat().st_size, "ok": True}
                           for n, m in md5s.items()}, "checksums": "sample"}
    (raw / "verify.json").write_text(json.dumps(verify, indent=2, sort_keys=True) + "\n")
    return project


def dvc_repro(project: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of DVC and its children): CPU time is the steadier figure on a shared machine."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-s", "extract"], cwd=project, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime


def in_process(archives: Path, out: Path, materialize: bool) -> float:
    """The stage's own work (scan + manifests [+ tree]) without Prefect/DVC overhead."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    for split in extract.SPLITS:
        extract.scan_archive_split(split, archives / ARCHIVES[split], out / "staging", root=out)
    extract.finalize(out / "staging", out / "manifests", out / "label_map.json",
                     devkit_path=archives / ARCHIVES["devkit"])
    if materialize:
        imagefolder.materialize(out / "manifests", out / "imagefolder", root=out)
    return time.perf_counter() - start


def measure(variant: str, archives: Path, env: dict[str, str]) -> dict[str, float]:
    project = make_project(variant, archives)
    before = snapshot(project)
    first, _ = dvc_repro(project, env)
    after = snapshot(project)
    changed = [p for p, v in after.items() if before.get(p) != v]
    noops = [dvc_repro(project, env) for _ in range(5)]
    work = in_process(archives, WORK / "inproc", materialize=variant != "index")
    return {"work_s": work, "first_s": first, "bytes": sum(after[p][0] for p in changed), "files": len(changed),
            "noop_s": min(w for w, _ in noops), "noop_cpu_s": min(c for _, c in noops)}


def prefect_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/api"
    wait_http(url + "/health", timeout=120)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--train-per-class", type=int, default=50)
    parser.add_argument("--val-per-class", type=int, default=10)
    args = parser.parse_args()
    archives = build_archives(args)
    images = args.classes * (args.train_per_class + args.val_per_class)
    size = sum((archives / n).stat().st_size for n in ARCHIVES.values())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server, env["PREFECT_API_URL"] = prefect_server(env)
    try:
        results = {variant: measure(variant, archives, env) for variant in VARIANTS}
    finally:
        server.terminate()
        server.wait(30)
    print(f"\nextract: {images} images, archives {size / 1e6:.0f} MB; dvc repro -s extract in a fresh project copy")
    head = (f"{'variant':<21}{'work s':>8}{'x':>6}{'repro s':>9}{'MB written':>12}{'files':>7}"
            f"{'no-op wall s':>14}{'no-op CPU s':>13}{'x':>6}")
    print(head + "\n" + "-" * len(head))
    base = results["index"]
    for variant, r in results.items():
        print(f"{variant:<21}{r['work_s']:>8.2f}{r['work_s'] / base['work_s']:>6.1f}{r['first_s']:>9.1f}"
              f"{r['bytes'] / 1e6:>12.1f}{r['files']:>7}{r['noop_s']:>14.2f}{r['noop_cpu_s']:>13.2f}"
              f"{r['noop_cpu_s'] / base['noop_cpu_s']:>6.2f}")


if __name__ == "__main__":
    main()

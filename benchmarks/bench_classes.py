"""ImageNet-21k's shape at small size (issue 22, item 3): ~19,000 classes of a few tiny images each, through the
real pipeline, and what each step costs per image and per class, projected to 13 M images / 1.2 TB.

Builds (once, cached under benchmarks/_work/classes/) a folder-mode tree `train/n%08d/*`, `val/n%08d/*` of 32x32
JPEGs, each its own seeded noise (distinct pixels: no chance near-duplicates; the pixels of one image shared by
all would make every train/val pair a near-duplicate), then in a project copy (tests/helpers/project.py) with
`extract.catalog: derived` runs each stage with `dvc repro -s <stage>` in a child whose getrusage(CHILDREN) gives
the stage's wall, CPU (user + system of every process) and peak RSS (the largest single process). Then version 2
(one train image excluded per class: every class changes) to size `versions/index.json` and `changes.json`.
Besides the stages: convert's `prepare` (the plan) alone, extract + plan on two smaller trees (fits
a + b * images + c * classes), the contact sheet, the near-duplicate fingerprint frame, the reader's open
(ShardIndex.build: one footer per shard), each in its own child process.

    python -m benchmarks.bench_classes [--classes 19000 --train 3 --val 1 --shard-mb 4 --workers-n 8]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks.classes_projection import project_run
from benchmarks.common import REPO, dvc_env, measured, ruled, unique_jpeg, update_params
from benchmarks.common import WORK as BENCH_WORK
from tests.helpers.project import GIT, copy_project
from tests.helpers.servers import isolate_prefect, prefect_server

WORK = BENCH_WORK / "classes"
STAGES = ("download", "verify", "extract", "convert", "curate", "validate")


def tiny_jpeg(seed: int, tag: str) -> bytes:
    """A 32x32 JPEG of seeded noise, with a COM segment naming it (unique bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=75)
    return unique_jpeg(buf.getvalue(), tag)


def build_tree(classes: int, per_split: dict[str, int]) -> Path:
    tree = WORK / f"tree-{classes}-{per_split['train']}-{per_split['val']}"
    if (tree / "done").is_file():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    seed = 0
    for split, count in per_split.items():
        for c in range(classes):
            folder = tree / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(count):
                seed += 1
                (folder / f"n{c:08d}_{split}_{i}.JPEG").write_bytes(tiny_jpeg(seed, f"{split}/{c}/{i}"))
    (tree / "done").write_text("")
    return tree


def python(code: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    return measured([sys.executable, "-c", textwrap.dedent(code)], cwd, env)


def make_project(name: str, tree: Path, args: argparse.Namespace) -> Path:
    base = WORK / name
    shutil.rmtree(base, ignore_errors=True)
    project = copy_project(base)
    update_params(
        project,
        {
            "extract": {"mode": "folder", "folder": str(tree), "catalog": "derived"},
            "convert": {"shard_mb": args.shard_mb},
        },
    )
    return project


PLAN = """
from tasks.common.params import load_project
from tasks.convert.job import job_from_params
from tasks.convert.stage import prepare
p = load_project("params.yaml")
print(len(prepare(job_from_params(p.params.convert, p.paths, p.root))))
"""
SHEET = """
from tasks.validate.contact_sheet import write_contact_sheet
write_contact_sheet("data/parquet", "data/label_map.json", "data/scratch/sheet.png", 4, 20)
"""
NEAR = """
import json
from imagenet_parquet.format import class_ids, read_label_map
from tasks.validate.near_dup import near_duplicate_check, read_fingerprints
from tests.helpers.params import validate_section
found, _ = read_fingerprints("data/parquet")
rows = sum(len(f.frame) for f in found.values())
per_row = sum(f.frame.memory_usage(deep=True).sum() for f in found.values()) / rows
check, _ = near_duplicate_check("data/parquet", validate_section(), class_ids(read_label_map("data/label_map.json")))
print(json.dumps({"bytes_per_row": per_row, "status": check.status, "pairs": check.failures}))
"""
READER = """
import json, time, pyarrow.parquet as pq
from pathlib import Path
from imagenet_parquet import ParquetImageDataset
t = time.perf_counter(); ds = ParquetImageDataset("data/parquet", "train", decode=False); wall = time.perf_counter() - t
shards = sorted(Path("data/parquet/train").glob("*.parquet"))
footer = [len(s.read_bytes()) - pq.read_metadata(s).row_group(0).column(0).file_offset for s in shards[:1]]
meta = pq.read_metadata(shards[0]).metadata
print(json.dumps({"open_s": wall, "shards": len(shards), "classes": len(ds.classes),
                  "metadata_bytes": sum(len(k) + len(v) for k, v in meta.items()),
                  "label_map_bytes": len(meta[b"imagenet_parquet"]), "hf_bytes": len(meta[b"huggingface"])}))
"""


SYNTH = """
import json, resource, sys, time
from pathlib import Path
import pyarrow as pa
from tasks.common.manifests import dictionary_columns, read_columns
from tasks.extract.stage import STAGING_SCHEMA, write_staging, finalize
from tasks.convert.stage import MANIFEST_COLUMNS
from tasks.convert.plan import ordered, plan_split
step, rows, classes, out, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
if step == "make":
    for split, n in (("train", rows), ("val", max(rows // 26, classes))):
        c = [f"n{i % classes:08d}" for i in range(n)]
        names = [f"{w}_{split}_{i}.JPEG" for i, w in enumerate(c)]
        archive = shape == "archive"  # one archive of per-class tars (21k), else a folder tree (one file each)
        source = ["raw/winter21_whole.tar"] * n if archive else [f"{split}/{w}/{m}" for w, m in zip(c, names)]
        member = [w + ".tar" for w in c] if archive else [""] * n
        sizes = [110_000 + i % 9973 for i in range(n)]
        table = pa.table({"wnid": c, "name": names, "source": source, "member": member, "offset": [0] * n,
                          "size": sizes})
        write_staging(out / "staging", split, table.cast(STAGING_SCHEMA), "synthetic", [])
    base = 0
elif step == "finalize":
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finalize(out / "staging", out / "manifests", out / "label_map.json", mode="folder", catalog="derived")
else:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for split in ("train", "val"):
        path = out / "manifests" / f"{split}.parquet"  # read as convert's planner reads it
        manifest = read_columns(path, MANIFEST_COLUMNS, dictionary_columns(path))
        plans = plan_split(split, ordered(manifest, "hashed"), 256 << 20, "b")
print(json.dumps({"base_mb": base / 1024, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def synthetic(rows: int, classes: int, env: dict[str, str], shape: str) -> dict[str, Any]:
    """finalize (extract's labelling, curation, sort and manifests) and the plan on a staging index of `rows`
    synthetic train rows (+ rows/26 val) in one process each, without files: RSS per row resolved at 10^6 rows."""
    out = WORK / f"synthetic-{shape}-{rows}"
    shutil.rmtree(out, ignore_errors=True)
    found: dict[str, Any] = {
        step: python_args(SYNTH, [step, str(rows), str(classes), str(out), shape], env)
        for step in ("make", "finalize", "plan")
    }
    found["rows"] = rows + max(rows // 26, classes)
    found["shape"] = shape
    shutil.rmtree(out, ignore_errors=True)
    return found


def python_args(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    return measured([sys.executable, "-c", textwrap.dedent(code), *args], REPO, env)


def extract_and_plan(name: str, tree: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    project = make_project(name, tree, args)
    for stage in ("download", "verify"):
        measured(["dvc", "repro", "-s", stage], project, env)
    return {"extract": measured(["dvc", "repro", "-s", "extract"], project, env), "plan": python(PLAN, project, env)}


def run_pipeline(tree: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    project = make_project("full", tree, args)
    steps: dict[str, Any] = {stage: measured(["dvc", "repro", "-s", stage], project, env) for stage in STAGES}
    steps["plan"] = python(PLAN, project, env)
    steps["contact sheet"] = python(SHEET, project, env)
    steps["near-dup frame"] = python(NEAR, project, env)
    steps["near_bytes_per_row"] = steps["near-dup frame"]["out"]["bytes_per_row"]
    steps["reader open"] = python(READER, project, env)
    steps["reader"] = steps["reader open"]["out"]
    steps["v1 sizes"] = output_sizes(project)
    subprocess.run([*GIT, "commit", "-qam", "v1"], cwd=project, env=env, check=False)
    lines = [f"train,n{c:08d},n{c:08d}_train_0.JPEG,bench" for c in range(args.classes)]
    with (project / "curation/exclude.csv").open("a") as f:
        f.write("".join(line + "\n" for line in lines))
    steps["v2 repro"] = measured(["dvc", "repro"], project, env)
    steps["v2 sizes"] = output_sizes(project)
    return project, steps


def output_sizes(project: Path) -> dict[str, float]:
    reports = project / "data/reports"
    files = {
        "index.json": project / "versions/index.json",
        "changes.json": project / "versions/changes.json",
        "schema_report.json": reports / "schema_report.json",
        "contact_sheet.png": reports / "contact_sheet.png",
    }
    sizes = {name: path.stat().st_size / 1e6 for name, path in files.items()}
    sizes["schema_report.md lines"] = len((reports / "schema_report.md").read_text().splitlines())
    sizes["manifests MB"] = sum(p.stat().st_size for p in (project / "data/manifests").glob("*")) / 1e6
    sizes["parquet MB"] = sum(p.stat().st_size for p in (project / "data/parquet").rglob("*.parquet")) / 1e6
    return sizes


def print_table(steps: dict[str, Any], images: int, classes: int) -> None:
    print(f"\n21k-shaped tree: {classes} classes, {images} images (32x32 JPEGs), one run each")
    head = f"{'step':<16}{'wall s':>9}{'CPU s':>9}{'peak RSS MB':>13}"
    print(ruled(head))
    for name, r in steps.items():
        if isinstance(r, dict) and "wall" in r:
            print(f"{name:<16}{r['wall']:>9.1f}{r['cpu']:>9.1f}{r['rss_mb']:>13.0f}")
    for found in steps["synthetic"].values():
        for step in ("finalize", "plan"):
            r = found[step]
            label = f"{step} {found['shape']} {found['rows']:,}"
            print(f"{label:<16}{r['wall']:>9.1f}{r['cpu']:>9.1f}{r['rss_mb']:>13.0f}")
    for key in ("v1 sizes", "v2 sizes"):
        print(
            f"{key}: "
            + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in steps[key].items())
        )
    print(f"reader: {steps['reader']}; near-dup frame: {steps['near_bytes_per_row']:.1f} B/row")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=19000)
    parser.add_argument("--train", type=int, default=3)
    parser.add_argument("--val", type=int, default=1)
    parser.add_argument("--shard-mb", type=float, default=4)
    parser.add_argument("--synthetic", type=int, default=1_300_000, help="rows of the in-process extract/plan")
    parser.add_argument("--workers-n", type=int, default=8, help="Dask workers in the cluster projection")
    args = parser.parse_args()
    isolate_prefect()  # the tests' isolated PREFECT_HOME, inherited by the server and every stage
    env = {**dvc_env(), "PYTHONPATH": ""}
    sizes = {
        "full": (args.classes, args.train),
        "fewer images": (args.classes, 1),
        "fewer classes": (args.classes // 4, args.train),
    }
    trees = {k: build_tree(c, {"train": t, "val": args.val}) for k, (c, t) in sizes.items()}
    with prefect_server(WORK / "prefect.log") as env["PREFECT_API_URL"]:
        fits = {k: extract_and_plan(k, trees[k], args, env) for k in ("fewer images", "fewer classes")}
        project, steps = run_pipeline(trees["full"], args, env)
    fits["full"] = {"extract": steps["extract"], "plan": steps["plan"]}
    # N and 2N rows (a manifest row group is 2^20 rows: below it the writer's batch grows with N too), both shapes
    steps["synthetic"] = {
        f"{shape} {n}": synthetic(n, args.classes, env, shape)
        for shape in ("archive", "folder")
        for n in (args.synthetic, 2 * args.synthetic)
    }
    images = args.classes * (args.train + args.val)
    print_table(steps, images, args.classes)
    counts = {k: (c, c * (t + args.val)) for k, (c, t) in sizes.items()}
    print(project_run(steps, fits, counts, args.workers_n))
    (WORK / "results.json").write_text(json.dumps({"steps": steps, "fits": fits, "counts": counts}, indent=1))
    shutil.rmtree(project / "data", ignore_errors=True)  # the trees stay (cached); the outputs go


if __name__ == "__main__":
    main()

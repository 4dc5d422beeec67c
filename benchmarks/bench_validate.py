"""Memory and speed of the validate stage's byte checks, next to a naive baseline, for N and 4N rows.

Each dataset holds `rows` images of `--blob-mb` MB (JPEG SOI + random bytes, so the decode sample is off) in
row groups of `--row-group-rows` rows. Every measurement runs in a fresh child process and reports its peak RSS
(VmHWM) and wall time:
  validate  tasks.validate.run_validation (metadata columns only in pandas; image bytes streamed per row group)
  baseline  the naive way: the whole split (image bytes included) read into a DataFrame, then hashed

    python -m benchmarks.bench_validate                 # N = 24 and 96 rows of 1 MB
    python -m benchmarks.bench_validate --rows 50 --json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]  # not benchmarks.common's: the child's peak RSS holds only what it measures
WORK = REPO / "benchmarks" / "_work" / "validate"
MODES = ("validate", "baseline")


def build(root: Path, rows: int, blob_mb: float, row_group_rows: int) -> Path:
    """A valid dataset of `rows` train images (val: a quarter of them, at least one per class)."""
    import numpy as np

    from tests.helpers.datasets import make_dataset

    size = int(blob_mb * (1 << 20))
    per_class = max(1, rows // 4)
    ds = make_dataset(
        root,
        classes=4,
        train_per_class=per_class,
        val_per_class=max(1, per_class // 4),
        blob=lambda seed: b"\xff\xd8" + np.random.default_rng(seed).bytes(size - 2),
    )
    ds.row_group_rows, ds.shards = row_group_rows, {"train": 2, "val": 1}
    ds.write()
    return root


def _child(mode: str, root: Path) -> None:
    """Run one measurement in this (fresh) process and print its JSON result."""
    import hashlib

    import pyarrow.parquet as pq

    from tasks.common.params import ValidateParams
    from tasks.validate.stage import run_validation

    started = time.perf_counter()
    if mode == "validate":
        params = ValidateParams(
            train_count=[1, 10**6],
            val_count=[1, 10**6],
            decode_sample=0,
            leakage_max_pairs=0,
            report_examples=5,
            contact_sheet_per_class=1,
            contact_sheet_classes=1,
            near_duplicates_distance=8,
            near_duplicates_max_pairs=0,
            near_duplicates_chance_margin=0,
            near_duplicates_train_distance=4,
            workers=1,
        )
        report = run_validation(root / "parquet", root / "manifests", root / "label_map.json", params)
        assert report["status"] == "pass", [c["message"] for c in report["checks"] if c["status"] != "pass"]
    else:
        for split in ("train", "val"):
            frame = pq.read_table(sorted((root / "parquet" / split).glob("*.parquet"))).to_pandas()
            digests = frame["image"].map(lambda image: hashlib.sha256(image["bytes"]).hexdigest())
            assert (digests == frame["sha256"]).all()
    seconds = time.perf_counter() - started
    print(json.dumps({"mode": mode, "peak_rss_mb": round(peak_rss_mb(), 1), "seconds": round(seconds, 2)}))


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM (reset by exec, unlike ru_maxrss, which a child inherits from the parent
    that forked it), else ru_maxrss."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(mode: str, root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_validate", "--child", mode, str(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def dataset_size(root: Path) -> tuple[int, float]:
    """(rows, MB) of the Parquet shards."""
    import pyarrow.parquet as pq

    files = sorted((root / "parquet").glob("*/*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), sum(f.stat().st_size for f in files) / 1e6


def run(rows: int, blob_mb: float, row_group_rows: int, work: Path) -> list[dict[str, Any]]:
    results = []
    for count in (rows, 4 * rows):
        root = build(work / f"rows-{count}", count, blob_mb, row_group_rows)
        total_rows, megabytes = dataset_size(root)
        results += [{"rows": total_rows, "parquet_mb": round(megabytes, 1), **measure(m, root)} for m in MODES]
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'rows':>6} {'parquet MB':>11} {'mode':>9} {'peak RSS MB':>12} {'seconds':>8}"]
    lines += [
        f"{r['rows']:>6} {r['parquet_mb']:>11} {r['mode']:>9} {r['peak_rss_mb']:>12} {r['seconds']:>8}" for r in results
    ]
    for mode in MODES:
        small, large = [r for r in results if r["mode"] == mode]
        growth = large["peak_rss_mb"] - small["peak_rss_mb"]
        extra = large["parquet_mb"] - small["parquet_mb"]
        lines.append(
            f"{mode}: peak RSS grows {growth:.1f} MB for {extra:.1f} MB more image bytes "
            f"({growth / extra:.2f} MB per MB)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=24, help="N: the small dataset's train rows (large: 4N)")
    parser.add_argument("--blob-mb", type=float, default=1.0)
    parser.add_argument("--row-group-rows", type=int, default=4)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (for the test)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], Path(args.child[1]))
        return
    results = run(args.rows, args.blob_mb, args.row_group_rows, args.work)
    print(json.dumps(results) if args.json else table(results))


if __name__ == "__main__":
    main()

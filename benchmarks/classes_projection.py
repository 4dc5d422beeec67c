"""bench_classes.py's projection to ImageNet-21k's size (13 M images, 1.2 TB, ~19,000 classes) from what it
measured: extract + plan fitted as a + b * images + c * classes (three trees), convert and validate per image,
SHA-256 per byte (measured here), and stated I/O rates."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

IMAGES, BYTES, CLASSES, CORES = 13_000_000, 1.2e12, 19_000, 16
CONVERT_MS = 0.957  # CPU ms per real JPEG, convert with the fingerprint (issue 22 item 4: 5,000 real JPEGs)
DISK_GBPS, SHARED_GBPS = 1.0, 2.0  # assumed read rates: one machine's disk, the cluster's shared storage (total)


def sha256_ms_per_mb() -> float:
    block = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
    start = time.process_time()
    hashlib.sha256(block).hexdigest()
    return (time.process_time() - start) * 1e3 / 64


def fit(fits: dict[str, Any], counts: dict[str, tuple[int, int]], step: str, key: str) -> np.ndarray:
    """(a, b per image, c per class) through the three trees' measurements."""
    names = sorted(fits)
    a = np.array([[1.0, counts[n][1], counts[n][0]] for n in names])
    return np.linalg.solve(a, np.array([fits[n][step][key] for n in names], dtype=float))


def fitted_lines(fits: dict[str, Any], counts: dict[str, tuple[int, int]]) -> list[str]:
    """extract and plan at 21k's size, from the fit through the three trees."""
    lines = []
    at = np.array([1.0, IMAGES, CLASSES])
    for step in ("extract", "plan"):
        cpu, rss = fit(fits, counts, step, "cpu"), fit(fits, counts, step, "rss_mb")
        lines.append(
            f"  {step:<8} CPU {cpu @ at:8.0f} s (per image {cpu[1] * 1e6:.1f} us, per class {cpu[2] * 1e3:.2f} ms), "
            f"peak RSS {rss @ at:6.0f} MB (per image {rss[1] * 1e6:.1f} B, per class {rss[2] * 1e6:.0f} B; "
            f"fit a + b*images + c*classes through the 3 trees; the RSS part is noise at <= 76k images)"
        )
    return lines


def synthetic_lines(steps: dict[str, Any]) -> list[str]:
    """finalize and plan at 21k's size, per row from the in-process runs on N and 2N synthetic rows, per shape."""
    lines = []
    for shape in ("archive", "folder"):
        found = [run for run in steps["synthetic"].values() if run["shape"] == shape]
        small, large = sorted(found, key=lambda run: run["rows"])
        for step in ("finalize", "plan"):
            rows = large["rows"] - small["rows"]
            per_row = {k: (large[step][k] - small[step][k]) / rows for k in ("cpu", "rss_mb")}
            rss = large[step]["rss_mb"] + per_row["rss_mb"] * (IMAGES - large["rows"])
            lines.append(
                f"  {step:<8} (in-process, {shape}, {small['rows']:,} and {large['rows']:,} synthetic rows): CPU "
                f"{per_row['cpu'] * 1e6:.1f} us/row -> {per_row['cpu'] * IMAGES:.0f} s, peak RSS "
                f"{per_row['rss_mb'] * 1e6:.0f} B/row -> {rss:.0f} MB at {IMAGES / 1e6:.0f} M rows"
            )
    return lines


def project_run(steps: dict[str, Any], fits: dict[str, Any], counts: dict[str, tuple[int, int]], workers: int) -> str:
    images = counts["full"][1]
    lines = [f"\nprojection to {IMAGES / 1e6:.0f} M images / {BYTES / 1e12:.1f} TB / {CLASSES} classes:"]
    lines += fitted_lines(fits, counts) + synthetic_lines(steps)
    at = np.array([1.0, IMAGES, CLASSES])
    sha = sha256_ms_per_mb()
    validate_row_ms = (steps["validate"]["cpu"] - steps["download"]["cpu"]) * 1e3 / images  # tiny images: per row
    # (less the startup of a stage: the download stage, which only stats the tree)
    validate_cpu = IMAGES * validate_row_ms / 1e3 + BYTES / 1e6 * sha / 1e3
    convert_cpu = IMAGES * CONVERT_MS / 1e3
    read_local, read_shared = BYTES / (DISK_GBPS * 1e9), BYTES / (SHARED_GBPS * 1e9)
    extract_cpu = fit(fits, counts, "extract", "cpu") @ at + fit(fits, counts, "plan", "cpu") @ at
    near = steps["near_bytes_per_row"] * IMAGES / 2**30
    lines += [
        (
            f"  convert  CPU {convert_cpu / 3600:6.1f} h ({CONVERT_MS} ms/real JPEG, issue 22 item 4); reads "
            f"{BYTES / 1e12:.1f} TB"
        ),
        (
            f"  validate CPU {validate_cpu / 3600:6.1f} h (per row {validate_row_ms:.3f} ms measured here + SHA-256 "
            f"{sha:.2f} ms/MB measured here x 1.2 TB); reads 1.2 TB again"
        ),
        f"  near-dup fingerprint frame {near:.1f} GiB ({steps['near_bytes_per_row']:.0f} B/row measured here)",
        (
            f"  16 cores, one machine (disk {DISK_GBPS} GB/s assumed): extract+plan {extract_cpu / 3600:.2f} h "
            f"(one process), convert {max(convert_cpu / CORES, read_local) / 3600:.1f} h, validate "
            f"{max(validate_cpu / CORES, read_local) / 3600:.1f} h (max of CPU / 16 and the read)"
        ),
    ]
    cluster = max(convert_cpu / (CORES * workers), read_shared)
    lines.append(
        f"  Dask, {workers} workers x {CORES} cores, archives on shared storage ({SHARED_GBPS} GB/s total assumed): "
        f"convert {cluster / 3600:.2f} h (max of CPU / {CORES * workers} and the shared read); extract+plan and "
        f"validate stay on one machine: {extract_cpu / 3600:.2f} h + "
        f"{max(validate_cpu / CORES, read_local) / 3600:.1f} h"
    )
    return "\n".join(lines)

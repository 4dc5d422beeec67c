"""Memory while validating large images stays flat in the number of rows' image bytes.

Runs `python -m benchmarks.bench_validate` (each measurement in a fresh process, peak RSS = VmHWM) on N and 4N
rows of 1 MB images: the naive baseline (bytes in a DataFrame) must grow with the bytes — proof the measurement sees
growth — while the validate stage's peak may grow by only a small fraction of them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.project import REPO


@pytest.mark.slow
def test_peak_memory_is_flat_in_image_bytes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_validate", "--rows", "16", "--json", "--work",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(results, indent=1))
    runs = {(r["mode"], r["rows"]): r for r in results}
    small, large = sorted({r["rows"] for r in results})
    extra_mb = runs["validate", large]["parquet_mb"] - runs["validate", small]["parquet_mb"]
    assert extra_mb > 40
    baseline = runs["baseline", large]["peak_rss_mb"] - runs["baseline", small]["peak_rss_mb"]
    validate = runs["validate", large]["peak_rss_mb"] - runs["validate", small]["peak_rss_mb"]
    assert baseline > 0.8 * extra_mb, results  # the measurement does see bytes held in memory
    assert validate < 0.25 * extra_mb, results  # the stage does not hold them

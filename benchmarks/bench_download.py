"""Download + verify of a ~1 GB archive over the loopback HTTP server vs `md5sum` of the same file.

    python -m benchmarks.bench_download [--mb 1024] [--keep]

Writes under benchmarks/_work/bench_download/ (deleted afterwards unless --keep). The file is read once by the
OS page cache before timing starts, so every row measures the same hot-cache situation. "passes" = times the bytes
were read by this process: from the network (the HTTP body, hashed on the way) plus from disk (syscall rchar /
file size; rchar does not count socket reads). md5sum reads the file exactly once by construction."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from benchmarks.common import REPO, WORK
from tasks.acquire.obtain import fetch_archive
from tasks.acquire.remote import FetchOptions
from tasks.acquire.verify import check_archive
from tasks.common.layout import ARCHIVES
from tests.helpers.servers import free_port, wait_http

T = TypeVar("T")
Row = tuple[str, float, float, str]  # case, seconds, passes over the bytes, note
NAME = ARCHIVES["val"]


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar")


def make_file(path: Path, mb: int) -> None:
    block = os.urandom(64 << 20)
    with open(path, "wb") as fh:
        for _ in range(mb // 64):
            fh.write(block)


def timed(fn: Callable[[], T]) -> tuple[float, int, T]:
    """(wall seconds, bytes this process read from files, fn's result) of one call."""
    start_t, start_r = time.perf_counter(), rchar()
    result = fn()
    return time.perf_counter() - start_t, rchar() - start_r, result


def http_rows(url: str, raw: Path, md5: str, cache: Path, size: int) -> list[Row]:
    """Download over HTTP (MD5 while streaming), then verify; passes = bytes read (network + disk) / file size."""
    opts = FetchOptions(progress=False)
    secs, read, record = timed(lambda: fetch_archive(NAME, url, raw, opts, cache))
    vsecs, vread, result = timed(lambda: check_archive(NAME, raw, md5, cache, "bench", progress=False))
    assert record["md5"] == md5 == result["md5"]
    net = record["bytes"] / size  # the body crossed the socket once, hashed as it arrived
    (raw / NAME).unlink()
    return [
        (
            "http download (md5 while streaming)",
            secs,
            net + read / size,
            f"network {net:.2f} + disk reads {read / size:.2f}",
        ),
        ("verify after download", vsecs, vread / size, f"md5 from: {result['md5_from'].split()[0]}"),
        ("download + verify", secs + vsecs, net + (read + vread) / size, "total"),
    ]


def curl_rows(url: str, work: Path) -> list[Row]:
    """The naive way, when curl is there: download to a file, then md5sum it."""
    if not shutil.which("curl"):
        return []
    naive = work / "naive.tar"
    t0 = time.perf_counter()
    subprocess.run(["curl", "-sf", "-o", str(naive), url], check=True)
    subprocess.run(["md5sum", str(naive)], check=True, capture_output=True)
    row = ("curl, then md5sum (naive baseline)", time.perf_counter() - t0, 2.0, "network 1 + disk 1")
    naive.unlink()
    return [row]


def local_row(src: Path, raw: Path, md5: str, cache: Path, size: int) -> Row:
    """A local source: linked, then verified."""
    secs, read, _ = timed(lambda: fetch_archive(NAME, str(src), raw, FetchOptions(progress=False), cache))
    vsecs, vread, result = timed(lambda: check_archive(NAME, raw, md5, cache, "bench", progress=False))
    note = f"{result['md5_from']} (1 pass: a linked file must be read once)"
    return "local link + verify", secs + vsecs, (read + vread) / size, note


def run(mb: int, work: Path) -> list[Row]:
    srv_root, raw, cache = work / "srv", work / "raw", work / "md5_cache.json"
    srv_root.mkdir(parents=True)
    src = srv_root / NAME
    make_file(src, mb)
    size = src.stat().st_size
    subprocess.run(["md5sum", str(src)], check=True, capture_output=True)  # warm the page cache
    t0 = time.perf_counter()
    md5 = subprocess.run(["md5sum", str(src)], check=True, capture_output=True, text=True).stdout.split()[0]
    base = time.perf_counter() - t0
    rows: list[Row] = [("md5sum (baseline)", base, 1.0, "1 read of the file")]
    port = free_port()
    url = f"http://127.0.0.1:{port}/{NAME}"
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "helpers" / "servers.py"), str(srv_root), str(port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_http(url)
        rows += http_rows(url, raw, md5, cache, size)
        ratio = rows[-1][1] / base  # download + verify
        rows += curl_rows(url, work)
        rows.append(local_row(src, raw, md5, cache, size))
    finally:
        server.terminate()
        server.wait()
    rows.append(("ratio download+verify / md5sum", ratio, float("nan"), f"{size / 2**20:.0f} MiB file"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = WORK / "bench_download"
    shutil.rmtree(work, ignore_errors=True)
    try:
        rows = run(args.mb, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'case':38} {'seconds':>9} {'passes':>7}  note")
    for case, secs, passes, note in rows:
        print(f"{case:38} {secs:9.2f} {passes:7.2f}  {note}")


if __name__ == "__main__":
    main()

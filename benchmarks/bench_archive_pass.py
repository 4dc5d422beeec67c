"""Benchmark verify + extract's read of the archives: one pass (MD5 and tar index together) vs two (today's MD5,
then the header walk) vs `md5sum`, each cold (posix_fadvise DONTNEED on the archives first), side by side.

    python -m benchmarks.bench_archive_pass [--archives DIR] [--classes 100 --train-per-class 400] [--repeat 2]
                                            [--keep] [--http]

DIR holds ILSVRC2012_img_train.tar / ILSVRC2012_img_val.tar (e.g. a bench_pipeline mirror); without it a mirror of
the real JPEGs of ../shared is built under benchmarks/_work/archive_pass/ (removed afterwards unless --keep).
Prints per variant: wall, CPU (this process, all threads), bytes read from disk and through read(), and the ratio
to `md5sum` of the same files. In "two passes" the cache is dropped between the MD5 and the walk, as for archives
larger than the RAM. `--http` adds two downloads over loopback HTTP (the page cache of the source is dropped, the
server reads it cold): the MD5 while streaming, and the MD5 + tar index while streaming.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import REPO, SAMPLES, cpu_seconds, evict, md_table, proc_io
from tasks.acquire.fetch import resumable_download
from tasks.acquire.md5state import compute_md5
from tasks.acquire.remote import FetchOptions, remote_size
from tasks.acquire.sample import write_sample
from tasks.common import ARCHIVES, SPLITS
from tasks.common.archive_pass import ArchivePass, StreamIndex, hash_and_index
from tasks.common.tarindex import index_nested, index_tar
from tests.helpers.servers import free_port, wait_http

WORK = REPO / "benchmarks" / "_work" / "archive_pass"
INDEX = {"train": index_nested, "val": index_tar}


def two_passes(paths: dict[str, Path]) -> None:
    """Today's verify then extract. The page cache is dropped between them: at ImageNet scale (138 GB, more than
    the RAM) the MD5's read has long left the cache when the header walk starts."""
    for split, path in paths.items():
        compute_md5(path, progress=False)
        evict([path])
        INDEX[split](path, split, "")


def one_pass(paths: dict[str, Path]) -> None:
    for split, path in paths.items():
        found = hash_and_index(path, split, "", progress=False)
        assert found.entries is not None, found.refused


def http_variants(paths: dict[str, Path]) -> dict[str, Callable[[dict[str, Path]], None]]:
    """Downloads over the loopback HTTP server (tests/helpers/servers.py) into a scratch raw/: the MD5 while
    streaming only (what extract's header walk followed), and the MD5 + tar index while streaming (the download
    stage now: no read of the archive before convert)."""
    root = next(iter(paths.values())).parent
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "helpers" / "servers.py"), str(root), str(port)],
        stdout=subprocess.DEVNULL,
    )
    atexit.register(server.terminate)
    wait_http(f"http://127.0.0.1:{port}/{ARCHIVES['val']}")
    opts = FetchOptions(progress=False)

    def fetch(index: bool) -> Callable[[dict[str, Path]], None]:
        def run(paths: dict[str, Path]) -> None:
            raw = WORK / "raw"
            shutil.rmtree(raw, ignore_errors=True)
            raw.mkdir(parents=True)
            for split, path in paths.items():
                url = f"http://127.0.0.1:{port}/{path.name}"
                if index:
                    _md5, found = download_and_index(split, url, raw / path.name, opts)
                    assert found is not None and found.entries is not None
                else:
                    resumable_download(url, raw / path.name, opts)
            shutil.rmtree(raw)

        return run

    return {
        "http download, MD5 while streaming": fetch(False),
        "http download, MD5 + tar index while streaming": fetch(True),
    }


def download_and_index(split: str, url: str, dest: Path, opts: FetchOptions) -> tuple[str, ArchivePass | None]:
    index = StreamIndex(split, dest, remote_size(url, opts) or 0)
    got, md5 = resumable_download(url, dest, opts, index)
    return md5, index.result(md5, got)


def md5sum(paths: dict[str, Path]) -> None:
    subprocess.run(["md5sum", *map(str, paths.values())], check=True, capture_output=True)


def measure(run: Callable[[dict[str, Path]], None], paths: dict[str, Path]) -> dict[str, float]:
    evict(paths.values())
    io0, cpu0, t0 = proc_io(), cpu_seconds(), time.perf_counter()
    run(paths)
    wall, io1 = time.perf_counter() - t0, proc_io()
    cpu = cpu_seconds() - cpu0
    return {"wall": wall, "cpu": cpu, **{key: io1[key] - io0[key] for key in ("rchar", "read_bytes")}}


def archives(args: argparse.Namespace) -> Path:
    if args.archives:
        return Path(args.archives)
    out = WORK / f"mirror-{args.classes}x{args.train_per_class}"
    if not (out / ARCHIVES["train"]).exists():
        write_sample(
            out,
            classes=args.classes,
            train_per_class=args.train_per_class,
            val_per_class=max(1, args.train_per_class // 25),
            real_images=SAMPLES,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archives")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--train-per-class", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the mirror built here for the next run")
    parser.add_argument("--http", action="store_true", help="also download the archives over loopback HTTP")
    args = parser.parse_args()
    root = archives(args)
    try:
        report(root, args.repeat, args.http)
    finally:
        if not (args.keep or args.archives):
            shutil.rmtree(WORK, ignore_errors=True)


def report(root: Path, repeat: int, http: bool) -> None:
    paths = {split: root / ARCHIVES[split] for split in SPLITS}
    size = sum(p.stat().st_size for p in paths.values())
    variants = {"md5sum": md5sum, "two passes (MD5, then header walk)": two_passes, "one pass": one_pass}
    if http:
        variants |= http_variants(paths)
    best: dict[str, dict[str, float]] = {}
    for _ in range(repeat):  # interleaved, best wall of each: the machine is shared
        for name, run in variants.items():
            got = measure(run, paths)
            if name not in best or got["wall"] < best[name]["wall"]:
                best[name] = got
    ref = best["md5sum"]["wall"]
    print(f"train + val archives: {size / 1e9:.2f} GB, {os.cpu_count()} CPUs, best of {repeat}, cold\n")
    header = ["variant", "wall s", "CPU s", "read() passes", "disk read passes", "wall / md5sum"]
    rows = [
        (
            name,
            f"{r['wall']:.1f}",
            f"{r['cpu']:.1f}",
            "—" if name == "md5sum" else f"{r['rchar'] / size:.2f}",
            f"{r['read_bytes'] / size:.2f}",
            f"{r['wall'] / ref:.2f}",
        )
        for name, r in best.items()
    ]
    print(md_table(header, rows))


if __name__ == "__main__":
    main()

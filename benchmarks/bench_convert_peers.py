"""Convert's CPU per image beside the writers of webdataset and MDS (mosaicml-streaming), on the same real JPEGs,
one process each, side by side in one run (issue 22, item 4).

    python -m benchmarks.bench_convert_peers [--copies 5] [--rounds 3] [--work DIR] [--baseline CHECKOUT]

The images are bench_convert.py's set (--copies x the 1000 real samples: copy 0 the original bytes, copy k cropped
by k pixels and re-encoded; one tar + manifest + label map, as extract indexes an archive). Every tool reads each
image through the manifest (pread) and writes ~256 MB shards of (image bytes, label); only what it stores and
computes differs:
  * this project: the convert stage (run_local, 1 worker, pass-through), convert.fingerprint true and false
    (byte index, per-image SHA-256, the shards' MD5 for DVC, Arrow/Parquet)
  * webdataset: wds.ShardWriter (tar, maxsize 256 MB), `jpg` + `cls`; then the same + the tars' MD5 (what DVC
    computes when it tracks them: convert hands DVC its MD5, webdataset leaves that to DVC)
  * MDS: streaming's MDSWriter (image: bytes, label: int; size_limit 256 MB; no compression, no hashes).
    `pip install mosaicml-streaming` would replace torch and numpy here, and its package __init__ imports
    torchvision and transformers: install it beside with `pip install --no-deps --target DIR mosaicml-streaming
    xxhash zstd`, put DIR on PYTHONPATH; the writer module is loaded without that __init__
  * byte copy: pread + append to one file (the floor)
A tool that does not import is listed as skipped. CPU = user + sys of the child per image (process_time); each tool
runs once per round in a fresh process, rounds interleaved; the table shows the least CPU over the rounds and the
median over rounds of the ratio to webdataset in the same round (the machine is shared: wall time swings)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks import bench_convert
from benchmarks.common import REPO

SHARD_BYTES = 256 << 20
TOOLS = [
    "this project, fingerprint true",
    "this project, fingerprint false",
    "webdataset",
    "webdataset + MD5 (DVC)",
    "MDS (MDSWriter)",
    "byte copy (floor)",
]
BASELINE = "baseline checkout, fingerprint false"
Result = dict[str, Any] | str  # a tool's measurement (count, cpu, wall, ms), or why it was skipped


def _reads(root: Path) -> Iterator[tuple[int, bytes]]:
    rows = pq.read_table(root / "data" / "manifests" / "train.parquet", columns=["label", "offset", "size"])
    fd = os.open(root / "data" / "raw" / "images.tar", os.O_RDONLY)
    for label, offset, size in zip(*(rows.column(c).to_pylist() for c in ("label", "offset", "size")), strict=True):
        yield label, os.pread(fd, size, offset)


def _webdataset(root: Path, out: Path, md5: bool) -> int:
    import webdataset as wds

    count = 0
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0) as sink:
        for count, (label, data) in enumerate(_reads(root), 1):
            sink.write({"__key__": f"{count:08d}", "jpg": data, "cls": str(label).encode()})
    if md5:
        for tar in sorted(out.glob("*.tar")):
            with open(tar, "rb") as fh:
                hashlib.file_digest(fh, "md5")
    return count


@functools.lru_cache(maxsize=1)
def _mds_writer() -> Any:
    """streaming's MDSWriter without streaming/__init__ (which imports torchvision and transformers)."""
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mosaicml-streaming not installed")
    base = spec.submodule_search_locations[0]
    for name, path in (("streaming", base), ("streaming.base", base + "/base")):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules.setdefault(name, module)
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter


def _mds(root: Path, out: Path) -> int:
    writer_cls, count = _mds_writer(), 0
    with writer_cls(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit=SHARD_BYTES) as writer:
        for label, data in _reads(root):
            writer.write({"image": data, "label": label})
            count += 1
    return count


def _copy(root: Path, out: Path) -> int:
    count = 0
    with open(out / "copy.bin", "wb") as fh:
        for _, data in _reads(root):
            count += fh.write(data) > 0
    return count


def child(tool: str, root: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Callable[[], int]] = {
        TOOLS[0]: lambda: bench_convert.stage(root, out, "passthrough", 1, fingerprint=True),
        TOOLS[1]: lambda: bench_convert.stage(root, out, "passthrough", 1, fingerprint=False),
        TOOLS[2]: lambda: _webdataset(root, out, md5=False),
        TOOLS[3]: lambda: _webdataset(root, out, md5=True),
        TOOLS[4]: lambda: _mds(root, out),
        TOOLS[5]: lambda: _copy(root, out),
    }
    if tool.startswith("this project"):
        import tasks.convert.stage  # noqa: F401  (imports outside the timing, as the other tools')
    elif tool.startswith("webdataset"):
        import webdataset  # noqa: F401
    elif tool.startswith("MDS"):
        _mds_writer()
    cpu, started = time.process_time(), time.perf_counter()
    count = runs[tool]()
    print(json.dumps({"count": count, "cpu": time.process_time() - cpu, "wall": time.perf_counter() - started}))


def _run(tool: str, root: Path, work: Path, baseline: Path | None = None) -> Result:
    """One tool in a fresh process; BASELINE: the convert stage (fingerprint false) of another checkout."""
    out = work / "out" / str(TOOLS.index(tool) if tool in TOOLS else len(TOOLS))
    subprocess.run(["rm", "-rf", str(out)], check=True)
    checkout, env = REPO, None
    if tool == BASELINE and baseline is not None:
        checkout, env = baseline, {**os.environ, "PYTHONPATH": str(baseline)}
        tool = TOOLS[1]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_convert_peers", "--child", tool, str(root), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
    )
    subprocess.run(["rm", "-rf", str(out)], check=True)
    if proc.returncode:
        return "skipped: " + (proc.stderr.strip().splitlines() or ["failed"])[-1][:120]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "ms": result["cpu"] / result["count"] * 1e3}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=bench_convert.WORK)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git worktree add DIR main`): its "
        "convert stage with fingerprint false runs too, in the same rounds",
    )
    args = parser.parse_args(argv)
    bench_convert.WORK = args.work
    root = bench_convert.build_images(args.copies)
    tools = TOOLS + [BASELINE] * (args.baseline is not None)
    rounds: list[dict[str, Result]] = []
    for k in range(args.rounds):
        rounds.append({tool: _run(tool, root, args.work, args.baseline) for tool in tools})
        print(
            f"round {k}: "
            + ", ".join(f"{t} {r['ms']:.3f}" if isinstance(r, dict) else f"{t} {r}" for t, r in rounds[-1].items()),
            flush=True,
        )
    print_table(rounds)


def print_table(rounds: list[dict[str, Result]]) -> None:
    images = next(r["count"] for r in rounds[0].values() if isinstance(r, dict))
    print(f"\n{images} images, one process each, {len(rounds)} rounds\n")
    print("| writer | CPU ms/img (least) | ÷ webdataset (median of rounds) | wall s (least) |\n|---|---:|---:|---:|")
    for tool in rounds[0]:
        runs = [run for r in rounds if isinstance(run := r[tool], dict)]
        if not runs:
            print(f"| {tool} | {rounds[0][tool]} | | |")
            continue
        ratios = [
            run["ms"] / peer["ms"]
            for r in rounds
            if isinstance(run := r[tool], dict) and isinstance(peer := r["webdataset"], dict)
        ]
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "—"
        print(f"| {tool} | {min(r['ms'] for r in runs):.3f} | {ratio} | {min(r['wall'] for r in runs):.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()

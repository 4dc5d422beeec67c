"""This reader beside its peers on the same images, warm and cold, side by side in one run (issue 13, item 3).

    python -m benchmarks.bench_peers [--images 5000] [--workers 2] [--batch-size 64] [--rounds 3] [--no-cold]
    python -m benchmarks.bench_peers --grayscale      # grayscale JPEGs: stored as found vs as RGB (item 5)

The images, the ImageFolder tree and the passthrough shards are bench_reader.py's (same `--work`, reused). Every
tool gets the same per-sample work — PIL decode + convert("RGB") -> RandomResizedCrop(224) -> flip -> uint8 CHW
tensor — through a torch DataLoader with the same workers and batch size; only how the bytes are stored and
read differs. Peers are optional (`pip install webdataset datasets`); a tool that is not installed is listed as
skipped, with the reason:
  * torchvision ImageFolder: torchvision is not installed beside torch 2.13 here, so "ImageFolder" is
    bench_reader's FolderDataset, which does what ImageFolder does per item (open, PIL convert RGB, transform).
  * litdata and mosaicml-streaming: `pip install --dry-run` would replace torch 2.13 (and numpy): not installed.
  * webdataset: tar shards written here (wds.ShardWriter, --wds-shards of them), shard shuffle + 1000-sample
    shuffle buffer, split over DataLoader workers by webdataset.
  * Hugging Face datasets: `load_dataset("parquet", ...)` over the same shards (it converts them into its Arrow
    cache once; cold runs evict that cache too), map-style with shuffle, the Image feature decoding.
Cold = every file under --work evicted from the page cache (posix_fadvise DONTNEED) right before each run.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks.bench_reader import (
    Epoch,
    FolderDataset,
    InMemoryDataset,
    RandomResizedCropFlip,
    Result,
    Run,
    Transform,
    epoch,
    hf_run,
    measure,
    prepare,
    warm,
)
from benchmarks.common import SAMPLES, WORK, evict_tree
from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset

FOLDER = "ImageFolder equivalent (PIL folder dataset)"


def webdataset_run(folder: list[tuple[str, int]], work: Path, shards: int, tf: Transform) -> Run | str:
    """webdataset tar shards written once under `work` (--wds-shards of them), read with shard shuffle and a
    1000-sample buffer; a reason to skip when webdataset is not installed (an optional peer)."""
    try:
        import webdataset as wds
    except ImportError:
        return "skipped: webdataset not installed (pip install webdataset)"
    out = work / "peers" / "wds"
    if not (out / "done").exists():
        out.mkdir(parents=True, exist_ok=True)
        per = -(-len(folder) // shards)
        with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=per, verbose=0) as sink:
            for k, (path, label) in enumerate(folder):
                sink.write({"__key__": f"{k:08d}", "jpg": Path(path).read_bytes(), "cls": str(label).encode()})
        (out / "done").write_text("")
    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]

    def sample(s: dict[str, Any]) -> tuple[Any, int]:
        return tf(Image.open(io.BytesIO(s["jpg"])).convert("RGB")), int(s["cls"])

    def run(args: argparse.Namespace) -> Epoch:
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000).map(sample)
        return epoch(ds, args)

    return run


def tools(folder: list[tuple[str, int]], shards: Path, args: argparse.Namespace) -> dict[str, Run | str]:
    tf = RandomResizedCropFlip()

    def ceiling(a: argparse.Namespace) -> Epoch:
        ds = ParquetImageDataset(shards, "train", decode=False, overlay=False)
        return epoch(InMemoryDataset([ds[i][0] for i in range(len(ds))], ds.targets.tolist(), tf), a, shuffle=True)

    return {
        FOLDER: lambda a: epoch(FolderDataset(folder, tf), a, shuffle=True),
        "decode-only ceiling (bytes in RAM)": ceiling,
        "this project, iterable (buffer 1000)": lambda a: epoch(
            ParquetIterableDataset(shards, "train", transform=tf, seed=1, overlay=False), a
        ),
        "this project, map-style, shuffle": lambda a: epoch(
            ParquetImageDataset(shards, "train", transform=tf, overlay=False), a, shuffle=True
        ),
        "litdata StreamingDataset": "skipped: installing litdata would replace torch 2.13 (pip install --dry-run)",
        "webdataset": webdataset_run(folder, args.work, args.wds_shards, tf),
        "mosaicml-streaming": "skipped: installing mosaicml-streaming would replace torch 2.13 and numpy",
        "HF datasets from Parquet": hf_run(shards, args.work, tf),
    }


def grayscale(samples: Path, repeats: int = 40) -> None:
    """Issue 13 item 5: the grayscale sample JPEGs as found vs re-encoded as RGB JPEG, bytes and decode CPU."""
    gray = [p for p in sorted(samples.glob("*.JPEG")) if Image.open(p).mode == "L"]
    totals: dict[str, list[float]] = {"as found (mode L)": [0, 0.0], "RGB JPEG q90": [0, 0.0], "RGB JPEG q95": [0, 0.0]}
    for path in gray:
        data = path.read_bytes()
        rgb = Image.open(io.BytesIO(data)).convert("RGB")
        variants = {"as found (mode L)": data}
        for quality in (90, 95):
            buf = io.BytesIO()
            rgb.save(buf, "JPEG", quality=quality)
            variants[f"RGB JPEG q{quality}"] = buf.getvalue()
        for name, blob in variants.items():
            started = time.process_time()
            for _ in range(repeats):
                Image.open(io.BytesIO(blob)).convert("RGB")
            totals[name][0] += len(blob)
            totals[name][1] += (time.process_time() - started) / repeats * 1000
    base_bytes, base_ms = totals["as found (mode L)"]
    print(f"{len(gray)} grayscale JPEGs in {samples}\n")
    print("| stored as | bytes (sum) | x as found | decode + convert('RGB') CPU ms (sum) | x as found |")
    print("|---|---:|---:|---:|---:|")
    for name, (size, ms) in totals.items():
        print(f"| {name} | {size:,} | {size / base_bytes:.2f} | {ms:.1f} | {ms / base_ms:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wds-shards", type=int, default=8)
    parser.add_argument("--samples", type=Path, default=SAMPLES)
    parser.add_argument("--work", type=Path, default=WORK / "reader")
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--grayscale", action="store_true", help="only the grayscale bytes/decode measurement")
    args = parser.parse_args(argv)
    if args.grayscale:
        return grayscale(args.samples)
    args.work = args.work / f"{args.images}-images"
    folder, shards, *_ = prepare(args)
    everything = tools(folder, shards, args)
    runs = {name: run for name, run in everything.items() if not isinstance(run, str)}
    for name, why in everything.items():
        if isinstance(why, str):
            print(f"  {name}: {why}")
    warm(sorted(p for p in args.work.rglob("*") if p.is_file()))
    best: dict[tuple[str, str], Result] = {}
    for cache in ["warm"] + ([] if args.no_cold else ["cold"]):
        for round_ in range(args.rounds):
            for name, run in runs.items():
                if cache == "cold" and "ceiling" in name:
                    continue
                if cache == "cold":
                    evict_tree([args.work])
                r = measure(cache, name, run, args)
                print(
                    f"  {cache}#{round_} {name:42s} {r.rate:6.0f} img/s {1000 / r.per_cpu:5.2f} CPU ms/img", flush=True
                )
                if (cache, name) not in best or r.rate > best[(cache, name)].rate:
                    best[(cache, name)] = r
    print_table(best, everything)


def print_table(best: dict[tuple[str, str], Result], everything: dict[str, Run | str]) -> None:
    print(
        "\n| reader | warm img/s | ÷ ImageFolder | CPU ms/img | cold img/s (best) | ÷ ImageFolder cold | "
        "cold ÷ own warm | cold CPU ms/img |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base_w, base_c = best[("warm", FOLDER)], best.get(("cold", FOLDER))
    for name, run in everything.items():
        if isinstance(run, str):
            print(f"| {name} | {run} | | | | | | |")
            continue
        w, c = best[("warm", name)], best.get(("cold", name))
        cold = (
            f"{c.rate:.0f} | {c.rate / base_c.rate:.2f} | {c.rate / w.rate:.2f} | {1000 / c.per_cpu:.2f}"
            if c and base_c
            else "— | — | — | —"
        )
        print(f"| {name} | {w.rate:.0f} | {w.rate / base_w.rate:.2f} | {1000 / w.per_cpu:.2f} | {cold} |")


if __name__ == "__main__":
    main()

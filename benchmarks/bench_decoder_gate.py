"""The decoder gate's cost (issue 48): CPU seconds of the crop callables on the 1,000 real sample JPEGs, this tree
against a baseline revision, interleaved in one process.

    python -m benchmarks.bench_decoder_gate [--baseline-rev REV] [--rounds 5] [--chunk 50] [--quiet-wait S]

The baseline's `imagenet_parquet/` is taken from git (`git archive REV`) into benchmarks/_work/decoder_gate/ and
imported beside this tree's as the package `imagenet_parquet_baseline` (its imports are relative), its
`tasks/convert/fingerprint.py` as a module of its own. Both run in this process, one torch thread (as in a DataLoader
worker), on the sample bytes held in RAM: for each path, each round, chunk by chunk (`--chunk` images), baseline and
new decode the same chunk one after the other, the order alternating from chunk to chunk, and each variant's process
CPU time is summed — so a machine that other jobs slow down slows both alike. Paths: TrainCrop(224) (its boxes
seeded per chunk: both variants decode the same boxes) and EvalCrop(224, resize=256) with every decoder there
(turbojpeg when IMAGENET_PARQUET_TURBOJPEG or the system has a TurboJPEG 3, simplejpeg, pillow), decode_image whole
and with draft_size=224, and convert's fingerprint (stored_fingerprint, whose reduced decode the gate guards too).
The table: CPU s per variant over all rounds, us per image, new / baseline overall and its range over the rounds.
The target: every crop path within 3 %."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.common import REPO, SAMPLES, WORK, add_quiet_wait, loadavg, md_table, quiet_gate

Run = Callable[[bytes], Any]


def baseline_modules(rev: str, work: Path) -> tuple[ModuleType, ModuleType]:
    """`imagenet_parquet` of `rev` as the package imagenet_parquet_baseline, and its convert fingerprint module."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True)
    tree = work / commit.stdout.strip()
    if not (tree / "imagenet_parquet_baseline").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", rev, "imagenet_parquet", "tasks/convert/fingerprint.py"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        (tree / "imagenet_parquet").rename(tree / "imagenet_parquet_baseline")
    sys.path.insert(0, str(tree))
    package = importlib.import_module("imagenet_parquet_baseline")
    spec = importlib.util.spec_from_file_location("fingerprint_baseline", tree / "tasks/convert/fingerprint.py")
    assert spec is not None and spec.loader is not None
    fingerprint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fingerprint)
    return package, fingerprint


def paths(package: ModuleType, fingerprint: ModuleType) -> dict[str, Run]:
    crops = importlib.import_module(package.__name__ + ".crops")
    decode = importlib.import_module(package.__name__ + ".decode")
    turbo = importlib.import_module(package.__name__ + ".turbo")
    decoders = [*(["turbojpeg"] if turbo.available() else []), *(["simplejpeg"] if decode.have_simplejpeg() else [])]
    runs: dict[str, Run] = {}
    for decoder in [*decoders, "pillow"]:
        runs[f"TrainCrop(224) {decoder}"] = crops.TrainCrop(224, decoder=decoder, generator=torch.Generator())
        runs[f"EvalCrop(224, 256) {decoder}"] = crops.EvalCrop(224, resize=256, decoder=decoder)
    runs["decode_image"] = decode.decode_image
    runs["decode_image draft_size=224"] = lambda data: decode.decode_image(data, draft_size=224)
    runs["convert fingerprint"] = fingerprint.stored_fingerprint
    return runs


def timed(run: Run, blobs: list[bytes], seed: int) -> float:
    generator = getattr(run, "generator", None)
    if generator is not None:
        generator.manual_seed(seed)
    start = time.process_time()
    for data in blobs:
        run(data)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", default="main", help="the tree before the change (default: main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=50, help="images per alternation")
    parser.add_argument("--samples", type=Path, default=SAMPLES)
    add_quiet_wait(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import imagenet_parquet
    from tasks.convert import fingerprint

    runs = {
        "baseline": paths(*baseline_modules(args.baseline_rev, WORK / "decoder_gate")),
        "new": paths(imagenet_parquet, fingerprint),
    }
    blobs = [path.read_bytes() for path in sorted(args.samples.glob("*.JPEG"))]
    chunks = [blobs[k : k + args.chunk] for k in range(0, len(blobs), args.chunk)]
    library = os.environ.get("IMAGENET_PARQUET_TURBOJPEG")
    print(quiet_gate(args.quiet_wait))
    print(
        f"{len(blobs)} images, baseline {args.baseline_rev}, new: this working tree, one process, one torch thread, "
        f"chunks of {args.chunk}, {args.rounds} rounds; TurboJPEG: "
        + (f"IMAGENET_PARQUET_TURBOJPEG = {Path(library).name}" if library else "the system's, if any")
    )
    totals: dict[str, dict[str, list[float]]] = {path: {"baseline": [], "new": []} for path in runs["new"]}
    for path, cpu in totals.items():
        for variant in ("baseline", "new"):
            timed(runs[variant][path], blobs[:50], 0)  # warm-up
        before = loadavg()
        for round_ in range(args.rounds):
            spent = {"baseline": 0.0, "new": 0.0}
            for k, chunk in enumerate(chunks):
                for variant in ("baseline", "new") if (k + round_) % 2 == 0 else ("new", "baseline"):
                    spent[variant] += timed(runs[variant][path], chunk, k)
            for variant, seconds in spent.items():
                cpu[variant].append(seconds)
        ratios = [n / b for n, b in zip(cpu["new"], cpu["baseline"], strict=True)]
        print(
            f"{path}: baseline {sum(cpu['baseline']):.2f} s, new {sum(cpu['new']):.2f} s, per round "
            + " ".join(f"{r:.3f}" for r in ratios)
            + f" (load {before} -> {loadavg()})",
            flush=True,
        )
    print_table(totals, len(blobs) * args.rounds)


def print_table(totals: dict[str, dict[str, list[float]]], images: int) -> None:
    rows = []
    for path, cpu in totals.items():
        base, new = sum(cpu["baseline"]), sum(cpu["new"])
        ratios = [n / b for n, b in zip(cpu["new"], cpu["baseline"], strict=True)]
        rows.append(
            [
                path,
                f"{base:.2f}",
                f"{new:.2f}",
                f"{base / images * 1e6:.0f}",
                f"{new / images * 1e6:.0f}",
                f"{new / base:.3f}",
                f"{min(ratios):.3f} .. {max(ratios):.3f}",
            ]
        )
    print()
    print(
        md_table(
            ["path", "baseline CPU s", "new CPU s", "baseline us/img", "new us/img", "new / baseline", "per round"],
            rows,
        )
    )


if __name__ == "__main__":
    main()

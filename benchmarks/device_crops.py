"""The crop paths on a machine with a CUDA GPU and many cores (issue 37, items 4 and 5), in one run:

    python -m benchmarks.device_crops --samples DIR --out DIR [--images 5000] [--workers 16]

1. torchvision's own RandomResizedCrop + RandomHorizontalFlip boxes and flips for seeded torch generators, written
   as tests/data/torchvision_crops.json (the test suite compares `imagenet_parquet.crops` with them: torchvision is
   not installed where the suite runs).
2. img/s over the same JPEG bytes in RAM (`--images`, the sample JPEGs repeated), RandomResizedCrop(224) + flip:
   the GPU path (`imagenet_parquet.gpu.GpuAugment`: batched nvJPEG decode, crops on the GPU), and on the CPU through
   a DataLoader with `--workers` (and 2) workers: `TrainCrop` (crop-first decode) and the full PIL decode ->
   crop -> resize (what ImageFolder does). NVIDIA DALI is measured when it is importable.
Needs torch and torchvision (the GPU's); writes `device_crops.md` (the table) and the JSON under --out.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from imagenet_parquet.crops import TrainCrop
from imagenet_parquet.gpu import GpuAugment, collate_bytes

SIZES = [(375, 500), (500, 375), (333, 500), (500, 500), (64, 64), (2400, 1800), (77, 1200), (1000, 10), (10, 1000)]
SETTINGS = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (3 / 4, 4 / 3)), ((0.25, 0.5), (0.5, 2.0))]


def golden() -> dict[str, Any]:
    """torchvision's boxes and flips: Compose([RandomResizedCrop, RandomHorizontalFlip]) draws get_params, then
    the flip's torch.rand(1), from torch's global generator."""
    from torchvision import transforms

    cases = []
    for seed in range(270):
        height, width = SIZES[seed % len(SIZES)]
        scale, ratio = SETTINGS[seed % len(SETTINGS)]
        torch.manual_seed(seed)
        image = torch.zeros((1, height, width), dtype=torch.uint8)
        top, left, h, w = transforms.RandomResizedCrop.get_params(image, list(scale), list(ratio))
        flipped = transforms.RandomHorizontalFlip(0.5)(torch.tensor([[[0, 1]]]))[0, 0, 0].item() == 1
        cases.append(
            {
                "seed": seed,
                "height": height,
                "width": width,
                "scale": scale,
                "ratio": ratio,
                "box": [int(top), int(left), int(h), int(w)],
                "flip": bool(flipped),
            }
        )
    import torchvision

    return {"torch": torch.__version__, "torchvision": torchvision.__version__, "cases": cases}


class Blobs(Dataset[tuple[Any, int]]):
    def __init__(self, blobs: list[bytes], item: Callable[[bytes], Any]):
        self.blobs, self.item = blobs, item

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.item(self.blobs[i]), 0


def full_decode(data: bytes) -> torch.Tensor:
    """ImageFolder's per-item work: PIL decode + RGB, RandomResizedCrop(224) on the PIL image, flip, to tensor."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = img.size
    for _ in range(10):
        area = width * height * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            left, top = random.randint(0, width - w), random.randint(0, height - h)
            break
    else:
        left, top, w, h = 0, 0, width, height
    img = img.resize((224, 224), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if random.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


def cpu_rate(blobs: list[bytes], item: Callable[[bytes], Any], workers: int) -> float:
    loader = DataLoader(Blobs(blobs, item), batch_size=256, num_workers=workers, shuffle=True)
    started, seen = time.perf_counter(), 0
    for images, _ in loader:
        seen += len(images)
    return seen / (time.perf_counter() - started)


def gpu_rate(blobs: list[bytes], workers: int) -> float:
    """Workers only hand over bytes; nvJPEG decodes a batch of 256 at once; crops and resizes on the GPU."""
    augment = GpuAugment(224, device="cuda", seed=0)
    loader = DataLoader(Blobs(blobs, lambda b: b), batch_size=256, num_workers=workers, collate_fn=collate_bytes)
    augment(blobs[:256])  # warm-up: CUDA context, nvJPEG handles
    torch.cuda.synchronize()
    started, seen = time.perf_counter(), 0
    for batch, _ in loader:
        seen += len(augment(batch))
    torch.cuda.synchronize()
    return seen / (time.perf_counter() - started)


def dali_rate(blobs: list[bytes]) -> float | str:
    try:
        from nvidia.dali import fn, pipeline_def  # noqa: F401
    except ImportError:
        return "not importable here"
    return "not measured"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torchvision_crops.json").write_text(json.dumps(golden(), indent=1) + "\n")
    sources = [p.read_bytes() for p in sorted(args.samples.glob("*.JPEG"))]
    blobs = [sources[k % len(sources)] for k in range(args.images)]
    rows = [
        (
            f"| {len(sources)} distinct JPEGs, {args.images} images in RAM, batch 256, "
            f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs, torch {torch.__version__} | img/s |"
        ),
        "|---|---:|",
    ]
    runs: dict[str, Callable[[], float]] = {
        f"GPU: nvJPEG batch decode + crop/resize on the GPU ({args.workers} byte workers)": lambda: gpu_rate(
            blobs, args.workers
        ),
        f"CPU: TrainCrop, {args.workers} workers": lambda: cpu_rate(blobs, TrainCrop(224), args.workers),
        f"CPU: full PIL decode + crop (ImageFolder's work), {args.workers} workers": lambda: cpu_rate(
            blobs, full_decode, args.workers
        ),
        "CPU: TrainCrop, 2 workers": lambda: cpu_rate(blobs, TrainCrop(224), 2),
        "CPU: full PIL decode + crop, 2 workers": lambda: cpu_rate(blobs, full_decode, 2),
    }
    for name, run in runs.items():
        best = max(run() for _ in range(2))
        rows.append(f"| {name} | {best:.0f} |")
        print(rows[-1], flush=True)
    rows.append(f"| NVIDIA DALI | {dali_rate(blobs)} |")
    (args.out / "device_crops.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

"""GPU decode path: batches of `decode=False` JPEG bytes decoded with nvJPEG and cropped on the GPU.

    from imagenet_parquet import ParquetIterableDataset
    from imagenet_parquet.gpu import GpuAugment, collate_bytes

    ds = ParquetIterableDataset("data/parquet", "train", decode=False)         # workers only read bytes
    loader = DataLoader(ds, batch_size=256, num_workers=4, collate_fn=collate_bytes)
    augment = GpuAugment(size=224, device="cuda")                            # RandomResizedCrop + flip
    for blobs, labels in loader:
        images = augment(blobs)                    # uint8 (N, 3, 224, 224) on the GPU; normalise there too
        labels = labels.cuda(non_blocking=True)

Decoding is `torchvision.io.decode_jpeg(list_of_tensors, device="cuda")` (batched nvJPEG; grayscale JPEGs come
out RGB with ImageReadMode.RGB). torchvision is imported only when `decode` runs: the reader never needs it.
The crop boxes follow torchvision's RandomResizedCrop.get_params (crops.rrc_box: 10 tries, then the centred
whole image clamped to the ratio range); each crop is resized with bilinear, antialiased interpolation
(torchvision's default for tensors). The shards hold JPEGs only (the convert stage turns PNG/GIF/CMYK into
RGB JPEG); those the decoder gate passes (imagenet_parquet/markers.py: every ImageNet JPEG) go to nvJPEG, the rest
(a lossless or 4:4:1 JPEG kept byte for byte, say) are decoded by Pillow on the CPU and moved to the device, as
the CPU crops do: one such image never costs the batch.
`augment` works on any device (the CPU tests use it), `decode` needs CUDA and torchvision."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from . import markers
from .crops import NumpyDraws, center_box, rrc_box
from .decode import decode_image


def collate_bytes(batch: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], torch.Tensor]:
    """DataLoader `collate_fn` for `decode=False` datasets: (list of image bytes, int64 label tensor)."""
    return [data for data, _ in batch], torch.tensor([int(label) for _, label in batch], dtype=torch.int64)


class GpuAugment:
    """bytes -> uint8 (N, 3, size, size) tensors on `device`: decode (nvJPEG), crop, resize, flip.

    `train=True`: RandomResizedCrop(size, scale, ratio) + horizontal flip with probability `flip`;
    `train=False`: the centred crop of `center_fraction` of the shorter side, resized to `size`, no flip.
    `seed` makes the boxes and flips reproducible (a numpy Generator per GpuAugment)."""

    def __init__(
        self,
        size: int = 224,
        *,
        train: bool = True,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        center_fraction: float = 0.875,
        device: str | torch.device = "cuda",
        seed: int | None = None,
    ):
        if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1] or not 0 <= flip <= 1:
            raise ValueError(
                f"expected 0 < scale[0] <= scale[1], 0 < ratio[0] <= ratio[1], 0 <= flip <= 1, found "
                f"scale={scale}, ratio={ratio}, flip={flip}"
            )
        self.size, self.train, self.scale, self.ratio, self.flip = size, train, scale, ratio, flip
        self.center_fraction, self.device = center_fraction, torch.device(device)
        self.rng = np.random.default_rng(seed)

    def __call__(self, blobs: Sequence[bytes]) -> torch.Tensor:
        return self.augment(self.decode(blobs))

    def decode(self, blobs: Sequence[bytes]) -> list[torch.Tensor]:
        """Batch-decode JPEG bytes on `device` with torchvision.io.decode_jpeg (those the decoder gate passes; the
        others with Pillow, then moved there): a list of uint8 (3, H, W), in order."""
        try:
            tvio = importlib.import_module("torchvision.io")  # lazily: the reader never needs torchvision
        except ImportError:
            raise ImportError(
                "GpuAugment.decode needs torchvision (torchvision.io.decode_jpeg, nvJPEG): "
                "pip install torchvision matching your torch"
            ) from None
        native = [markers.native_size(b) is not None for b in blobs]
        data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b, ok in zip(blobs, native, strict=True) if ok]
        images: Any = tvio.decode_jpeg(data, mode=tvio.ImageReadMode.RGB, device=self.device) if data else []
        decoded = iter(images)
        return [next(decoded) if ok else self._on_cpu(b) for b, ok in zip(blobs, native, strict=True)]

    def _on_cpu(self, blob: bytes) -> torch.Tensor:
        """A JPEG the gate keeps from nvJPEG: Pillow's full decode (uint8 (3, H, W)) moved to the device."""
        pixels = np.asarray(decode_image(blob))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).to(self.device)

    def boxes(self, shapes: Sequence[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
        """One (top, left, h, w) per (height, width), drawn from this augment's generator."""
        if not self.train:
            return [center_box(h, w, self.center_fraction) for h, w in shapes]
        draws = NumpyDraws(self.rng)
        return [rrc_box(h, w, self.scale, self.ratio, draws) for h, w in shapes]

    def augment(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Crop, resize (bilinear, antialiased) and flip decoded uint8 (3, H, W) images on their device."""
        out = torch.empty((len(images), 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        boxes = self.boxes([(int(img.shape[-2]), int(img.shape[-1])) for img in images])
        flips = self.rng.random(len(images)) < self.flip if self.train else np.zeros(len(images), dtype=bool)
        for k, (img, (top, left, h, w)) in enumerate(zip(images, boxes, strict=True)):
            crop = img[None, :, top : top + h, left : left + w].float()
            resized = F.interpolate(
                crop, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False
            )
            out[k] = resized[0].round_().clamp_(0, 255).to(torch.uint8)
        if flips.any():
            index = torch.from_numpy(np.flatnonzero(flips)).to(self.device)
            out[index] = out[index].flip(-1)
        return out

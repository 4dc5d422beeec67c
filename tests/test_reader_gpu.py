"""The GPU decode path (imagenet_parquet.gpu): the crop maths, batching and crop/resize/flip run on the CPU here;
nvJPEG decoding needs CUDA and torchvision and is skipped without them."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetIterableDataset
from imagenet_parquet.crops import NumpyDraws, center_box, rrc_box
from imagenet_parquet.gpu import GpuAugment, collate_bytes
from tests.helpers.datasets import write_shards
from tests.helpers.images import indexed_jpeg


def test_crop_boxes_stay_inside_within_scale_and_ratio_and_are_seeded():
    rng = np.random.default_rng(0)
    for height, width in [(375, 500), (500, 333), (64, 64), (1200, 90)]:
        for _ in range(200):
            top, left, h, w = rrc_box(height, width, (0.08, 1.0), (3 / 4, 4 / 3), NumpyDraws(rng))
            assert top >= 0 and left >= 0 and top + h <= height and left + w <= width and h > 0 and w > 0
            if (h, w) != (height, width) and 0.08 * height * width <= h * w:  # not the fallback
                assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05
                assert h * w <= height * width
    top, left, h, w = rrc_box(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), NumpyDraws(np.random.default_rng(1)))
    assert (w, h) == (10, round(10 / (3 / 4))) and top == (1000 - h) // 2  # fallback: clamped ratio, centred
    a = GpuAugment(device="cpu", seed=5).boxes([(300, 400)] * 8)
    assert (
        a
        == GpuAugment(device="cpu", seed=5).boxes([(300, 400)] * 8)
        != GpuAugment(device="cpu", seed=6).boxes([(300, 400)] * 8)
    )
    assert center_box(300, 400, 0.875) == (19, 69, 262, 262)
    with pytest.raises(ValueError, match="scale"):
        GpuAugment(scale=(0.5, 0.1), device="cpu")


def test_augment_crops_resizes_and_flips_on_the_device():
    gradient = torch.arange(400, dtype=torch.float32).div(400 / 255).round().to(torch.uint8)
    image = gradient.expand(3, 300, 400).contiguous()  # left to right: dark to bright
    plain = GpuAugment(32, train=False, device="cpu")
    out = plain.augment([image, image[:, :200, :150]])
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.uint8
    assert out[0, 0, 0, 0] < out[0, 0, 0, -1]  # not flipped in evaluation
    always = GpuAugment(32, flip=1.0, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), device="cpu", seed=0)
    flipped = always.augment([image])
    assert flipped[0, 0, 0, 0] > flipped[0, 0, 0, -1]  # the whole image, mirrored
    never = GpuAugment(32, flip=0.0, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), device="cpu", seed=0).augment([image])
    assert torch.equal(never.flip(-1), flipped)
    assert abs(int(never[0, 0, 0, 16]) - 128) <= 6  # the resize keeps the gradient's middle in the middle


def test_collate_bytes_batches_a_decode_false_dataset(tmp_path):
    write_shards(tmp_path, total=10, shards=1, row_group_rows=4)
    ds = ParquetIterableDataset(tmp_path, "train", decode=False, shuffle=False)
    batches = list(DataLoader(ds, batch_size=4, collate_fn=collate_bytes))
    blobs, labels = batches[0]
    assert [len(b) for b, _ in batches] == [4, 4, 2] and labels.dtype == torch.int64
    assert blobs[1] == indexed_jpeg(1) and labels.tolist() == [0, 0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nvJPEG)")
def test_nvjpeg_decode_matches_pil_and_makes_grayscale_rgb():
    pytest.importorskip("torchvision")
    rng = np.random.default_rng(0)
    colour = Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8))
    gray = Image.fromarray(rng.integers(0, 256, (80, 60), dtype=np.uint8), "L")
    blobs = []
    for im in (colour, gray):
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=95)
        blobs.append(buf.getvalue())
    decoded = GpuAugment(device="cuda").decode(blobs)
    assert [tuple(d.shape) for d in decoded] == [(3, 96, 128), (3, 80, 60)] and decoded[0].is_cuda
    ref = torch.from_numpy(np.asarray(Image.open(io.BytesIO(blobs[0])).convert("RGB"))).permute(2, 0, 1)
    assert (decoded[0].cpu().int() - ref.int()).abs().float().mean() < 3  # nvJPEG vs libjpeg: IDCT rounding
    out = GpuAugment(64, device="cuda", seed=0)(blobs)
    assert out.shape == (2, 3, 64, 64) and out.is_cuda and math.isfinite(out.float().mean().item())

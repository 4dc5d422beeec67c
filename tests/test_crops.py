"""The training / evaluation crop decoded straight from JPEG bytes (imagenet_parquet.crops): the same boxes as
torchvision for the same generator, pixels within a stated tolerance of full decode -> crop -> resize (on the real
sample JPEGs, grayscale, CMYK and EXIF-rotated ones included), both decoders, and through the readers and real
DataLoader workers."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import imagenet_parquet.decode as decode_module
from imagenet_parquet import EvalCrop, ParquetImageDataset, ParquetIterableDataset, TrainCrop, decode_image
from imagenet_parquet.crops import NumpyDraws, TorchDraws, crop_resized, dct_denominator, eval_window, rrc_box
from imagenet_parquet import turbo
from imagenet_parquet.decode import Encoded, have_simplejpeg
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify, jpeg, noisy_jpeg
from tests.helpers.project import REPO

GOLDEN = Path(__file__).parent / "data" / "torchvision_crops.json"
DECODERS = [
    pytest.param("turbojpeg", marks=pytest.mark.skipif(not turbo.available(), reason="no TurboJPEG 3 library")),
    pytest.param("simplejpeg", marks=pytest.mark.skipif(not have_simplejpeg(), reason="simplejpeg not installed")),
    "pillow",
]


def _smooth_jpeg(size: tuple[int, int], seed: int = 0, mode: str = "RGB", **save) -> bytes:
    """A photo-like JPEG (smooth gradients plus mild noise) of `size` in `mode`."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    noise = np.random.default_rng(seed).normal(0, 6, (h, w, 3))
    pixels = np.stack([x / w * 255, y / h * 255, (x + y) / (w + h) * 255], axis=-1) + noise
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def _reference_train(data: bytes, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """torchvision's PIL path: full decode, crop, resize (bilinear, antialiased)."""
    top, left, h, w = box
    image = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h))
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR))


def _reference_eval(data: bytes, resize: int, size: int) -> np.ndarray:
    """torchvision's Resize(resize) + CenterCrop(size) on the PIL image (its size arithmetic)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    short, long = (w, h) if w <= h else (h, w)
    new_w, new_h = (resize, int(resize * long / short)) if w <= h else (int(resize * long / short), resize)
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return np.asarray(image.crop((left, top, left + size, top + size)))


def _hwc(image) -> np.ndarray:
    return image.permute(1, 2, 0).numpy() if isinstance(image, torch.Tensor) else np.asarray(image)


def _stats(fast, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and 99th-percentile absolute difference."""
    diff = np.abs(_hwc(fast).astype(np.int16) - reference.astype(np.int16)).reshape(-1, 3)
    return diff.mean(axis=0), np.percentile(diff, 99, axis=0)


# ---------------------------------------------------------------- boxes


def test_boxes_and_flips_equal_torchvision_for_the_same_generator_state():
    """Boxes and flips recorded from torchvision's RandomResizedCrop + RandomHorizontalFlip (transforms v1, PIL
    input) for seeded torch generators (tests/data/torchvision_crops.json, written by benchmarks/device_crops.py
    with torchvision installed), drawn again here from the same seeds."""
    golden = json.loads(GOLDEN.read_text())
    assert len(golden["cases"]) >= 200
    for case in golden["cases"]:
        torch.manual_seed(case["seed"])
        draws = TorchDraws()
        box = rrc_box(case["height"], case["width"], tuple(case["scale"]), tuple(case["ratio"]), draws)
        assert [*box, draws.below(0.5)] == [*case["box"], case["flip"]], case


def test_torch_generator_argument_reproduces_the_global_generator_sequence():
    generator = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    ours = [rrc_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), TorchDraws(generator)) for _ in range(50)]
    assert ours == [rrc_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), TorchDraws()) for _ in range(50)]


def test_boxes_stay_inside_follow_scale_and_ratio_and_fall_back_like_torchvision():
    draws = NumpyDraws(np.random.default_rng(0))
    for height, width in [(375, 500), (500, 375), (64, 64), (10, 1000), (1000, 10)]:
        for _ in range(200):
            top, left, h, w = rrc_box(height, width, (0.08, 1.0), (3 / 4, 4 / 3), draws)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
    # no box of area >= 90 % fits a 10:1000 image at ratio <= 4/3: the centred whole image clamped to the ratio
    assert rrc_box(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), draws) == (493, 0, 13, 10)
    assert rrc_box(10, 1000, (0.9, 1.0), (3 / 4, 4 / 3), draws) == (0, 493, 10, 13)


def test_dct_scale_is_the_largest_that_keeps_the_output_resolution():
    assert dct_denominator(447, 900, 224, 224) == 1
    assert dct_denominator(448, 900, 224, 224) == 2
    assert dct_denominator(896, 1792, 224, 224) == 4
    assert dct_denominator(4000, 4000, 224, 224) == 8
    assert dct_denominator(100, 100, 224, 224) == 1  # an upscale decodes at full size


# ---------------------------------------------------------------- pixels


def _train_pairs(paths: list[Path], size: int, decoder: str, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for path in paths:
        data = path.read_bytes()
        image = Encoded.parse(data, decoder)
        box = rrc_box(image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3), TorchDraws(generator))
        scale = dct_denominator(box[2], box[3], size, size) if image.scalable else 1
        yield scale, crop_resized(image, box, size), _reference_train(data, box, size)


def _check_tolerance(by_scale: dict[int, list], exact_mean: float = 0.1) -> None:
    """Scale 1: the same pixels as the full decode but for rounding (every image: per-channel mean <= 0.1, 99th
    percentile <= 3: TurboJPEG's region decode upsamples chroma at the region's edge without the pixels beyond). Reduced scales (libjpeg-turbo's DCT-domain downscale instead of part of the antialiasing
    filter): mean over images <= 2 per channel, 99th percentile <= 11 on average, no image's mean above 8
    (measured on the 1,000 samples: docs/trainer.md)."""
    assert by_scale.get(1), "no image at scale 1"
    for scale, stats in by_scale.items():
        means, p99s = np.array([m for m, _ in stats]), np.array([p for _, p in stats])
        if scale == 1:
            assert means.max() <= exact_mean and p99s.max() <= 3, (scale, means.max(), p99s.max())
        else:
            assert means.mean() <= 2 and p99s.mean() <= 11 and means.max() <= 8, (scale, means.mean(), p99s)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("size", [224, 48])
def test_train_crop_pixels_match_full_decode_crop_resize_on_real_jpegs(shared_data, decoder, size):
    """All 1,000 real sample JPEGs (23 grayscale, one with EXIF orientation 6), at 224 (mostly scale 1) and at 48
    (every DCT scale: 1/2, 1/4 and 1/8 occur)."""
    paths = sorted((shared_data / "imagenet-samples").glob("*.JPEG"))
    assert len(paths) == 1000
    by_scale: dict[int, list] = {}
    for scale, fast, reference in _train_pairs(paths, size, decoder, seed=size):
        by_scale.setdefault(scale, []).append(_stats(fast, reference))
    if size == 48:
        assert {1, 2, 4, 8} <= set(by_scale), sorted(by_scale)
    _check_tolerance(by_scale)


@pytest.mark.parametrize("decoder", DECODERS)
def test_eval_crop_pixels_match_resize_then_center_crop_on_real_jpegs(shared_data, decoder):
    paths = sorted((shared_data / "imagenet-samples").glob("*.JPEG"))
    by_scale: dict[int, list] = {}
    crop = EvalCrop(224, resize=256, decoder=decoder)
    for path in paths:
        data = path.read_bytes()
        image = Encoded.parse(data)
        top, left, h, w = eval_window(image.height, image.width, 256, 224)
        scale = dct_denominator(h, w, 224, 224)
        by_scale.setdefault(scale, []).append(_stats(crop(data), _reference_eval(data, 256, 224)))
    assert {1, 2} <= set(by_scale)
    _check_tolerance(by_scale)


@pytest.mark.parametrize("decoder", DECODERS)
def test_cmyk_grayscale_png_and_exif_images_take_a_correct_path(decoder):
    """CMYK JPEGs (never in shards: convert stores RGB), grayscale, a PNG (no DCT scaling) and an
    EXIF-rotated JPEG (orientation not applied, as torchvision's PIL loader) all equal the reference."""
    exif = Image.Exif()
    exif[0x0112] = 6
    cases = {
        "cmyk": _smooth_jpeg((600, 450), 1, "CMYK"),
        "gray": _smooth_jpeg((600, 450), 2, "L"),
        "png": jpeg(size=(300, 200), fmt="PNG"),
        "exif": _smooth_jpeg((600, 450), 3, exif=exif.tobytes()),
    }
    for name, data in cases.items():
        generator = torch.Generator().manual_seed(1)
        for _ in range(5):
            image = Encoded.parse(data, decoder)
            box = rrc_box(image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3), TorchDraws(generator))
            fast, reference = crop_resized(image, box, 224), _reference_train(data, box, 224)
            assert fast.shape == (3, 224, 224) and fast.dtype == torch.uint8, name
            mean, _ = _stats(fast, reference)
            exact = 1.1 if name == "cmyk" else 0.1  # simplejpeg's CMYK -> RGB rounds 1 off Pillow's (shards hold RGB)
            assert mean.max() <= (exact if dct_denominator(box[2], box[3], 224, 224) == 1 else 2.5), (name, mean)


def test_auto_takes_the_first_decoder_there_and_falls_back_to_pillow_with_the_same_pixels(monkeypatch):
    data = _smooth_jpeg((640, 480))
    first = "turbojpeg" if turbo.available() else "simplejpeg" if have_simplejpeg() else "pillow"
    assert Encoded.parse(data).backend == first
    fast = TrainCrop(224, generator=torch.Generator().manual_seed(3))(data)
    monkeypatch.setattr(decode_module, "simplejpeg", None)
    monkeypatch.setattr(turbo, "library", lambda: None)
    assert Encoded.parse(data).backend == "pillow" and not turbo.available()
    without = TrainCrop(224, generator=torch.Generator().manual_seed(3))(data)
    assert _stats(without, _hwc(fast))[0].max() <= 2.0  # all libjpeg-turbo; builds and edges differ by rounding
    for name in ("turbojpeg", "simplejpeg"):
        with pytest.raises(ValueError, match=f"decoder='{name}': expected it installed"):
            TrainCrop(224, decoder=name)


@pytest.mark.skipif(not turbo.available(), reason="no TurboJPEG 3 library")
def test_turbojpeg_decodes_only_the_region_and_refuses_what_it_cannot_convert():
    data = _smooth_jpeg((640, 480))  # 4:2:0: 16-pixel iMCUs
    image = Encoded.parse(data, "turbojpeg")
    pixels, y0, x0 = image.decode(1, None, (100.0, 203.0, 150.0, 220.0))
    assert (y0, x0) == (100, 192) and pixels.shape == (150, 231, 3)  # left edge down to the iMCU at 192
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[100:250, 192:423]
    assert np.abs(pixels.astype(int) - full).mean() < 0.2
    half, y0, x0 = image.decode(2, None, (100.0, 203.0, 150.0, 220.0))
    assert (y0, x0) == (50, 96) and half.shape == (75, 116, 3)  # scaled iMCU: 8 pixels
    cmyk = _smooth_jpeg((64, 48), 1, "CMYK")
    assert Encoded.parse(cmyk, "turbojpeg").backend != "turbojpeg"  # left to the next decoder
    with pytest.raises(turbo.TurboError):
        turbo.header(b"\xff\xd8 not a jpeg")
    truncated = data[: len(data) // 2]  # TurboJPEG decodes it with a warning (the rest grey): Pillow decides
    with pytest.raises(OSError, match="truncated"):
        TrainCrop(224, decoder="turbojpeg")(truncated)
    with pytest.raises(OSError, match="truncated"):
        decode_image(truncated)


def test_decompression_bomb_bound_and_bad_arguments():
    data = _smooth_jpeg((400, 300))
    with pytest.raises(Image.DecompressionBombError, match="max_pixels=10,000"):
        TrainCrop(224, max_pixels=10_000)(data)
    small = TrainCrop(32, scale=(0.9, 1.0), max_pixels=10_000)  # 1/8 scale: 50x38 pixels decoded, under the bound
    assert small(data).shape == (3, 32, 32)
    for bad in [dict(size=0), dict(scale=(0.5, 0.1)), dict(ratio=(0, 1)), dict(flip=2), dict(decoder="opencv")]:
        with pytest.raises(ValueError, match="expected size >= 1"):
            TrainCrop(**bad)
    with pytest.raises(ValueError, match="size..resize"):
        EvalCrop(256, resize=224)


def test_same_seed_same_crops_and_flip_is_a_mirror():
    data = noisy_jpeg(5, size=(320, 240))
    first = [TrainCrop(64, generator=torch.Generator().manual_seed(9))(data) for _ in range(2)]
    assert torch.equal(first[0], first[1])
    no_flip = TrainCrop(64, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), flip=0.0)(data)
    flipped = TrainCrop(64, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), flip=1.0)(data)
    assert torch.equal(no_flip.flip(-1), flipped)


# ---------------------------------------------------------------- readers


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    write_shards(root, total=47, classes=3)  # image i: an 8x8 JPEG whose colour says i
    return root


def _index(image: torch.Tensor) -> int:
    return identify(Image.fromarray(image.permute(1, 2, 0).numpy()))


def test_map_and_iterable_readers_yield_crops_with_the_right_labels_in_dataloader_workers(shards):
    from torch.utils.data import DataLoader

    maps = ParquetImageDataset(shards, "train", crop=EvalCrop(16, resize=16))
    image, label = maps[20]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and (_index(image), label) == (20, 1)
    iterable = ParquetIterableDataset(shards, "train", crop=TrainCrop(16), batch_size=4, seed=3)
    seen = []
    for images, labels in DataLoader(iterable, batch_size=4, num_workers=2):
        assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.uint8
        seen += [(_index(img), int(y)) for img, y in zip(images, labels)]
    assert sorted(i for i, _ in seen) == list(range(47))
    assert all(label == i * 3 // 47 for i, label in seen)


def test_a_user_transform_runs_after_the_crop(shards):
    ds = ParquetImageDataset(shards, "train", crop=EvalCrop(8, resize=8), transform=lambda t: t.float() / 255)
    image, _ = ds[0]
    assert image.dtype == torch.float32 and image.shape == (3, 8, 8)


def test_without_torch_the_crop_is_a_numpy_array(shards):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, imagenet_parquet as ip\n"
        f"ds = ip.ParquetImageDataset({str(shards / 'train')!r}, crop=ip.TrainCrop(12, scale=(1, 1), ratio=(1, 1)))\n"
        "image, label = ds[30]\n"
        "assert isinstance(image, np.ndarray) and image.shape == (12, 12, 3) and image.dtype == np.uint8\n"
        "print('ok', label, image[6, 6].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    word, label, pixel = out.stdout.split(maxsplit=2)
    assert (word, int(label)) == ("ok", 30 * 3 // 47)
    assert identify(Image.new("RGB", (8, 8), tuple(json.loads(pixel)))) == 30

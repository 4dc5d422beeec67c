"""Decode only what the training crop needs: the crop box first (from the JPEG header's size), then the image at the
smallest DCT scale that still covers the output inside that box, then only the box resized.

    from imagenet_parquet import ParquetIterableDataset, TrainCrop, EvalCrop

    train = ParquetIterableDataset("data/parquet", "train", crop=TrainCrop(224), batch_size=256)
    val = ParquetImageDataset("data/parquet", "val", crop=EvalCrop(224, resize=256))

`TrainCrop` is torchvision's `RandomResizedCrop(size, scale, ratio)` + `RandomHorizontalFlip(flip)`: the box is
drawn exactly as `RandomResizedCrop.get_params` draws it (10 tries, then the centred whole image clamped to the
ratio range) from torch's global generator, as torchvision does (or `generator=`); the same generator state gives
the same boxes and flips. `EvalCrop` is `Resize(resize)` + `CenterCrop(size)` as one window of the original.

The JPEG is decoded by libjpeg-turbo at 1/1, 1/2, 1/4 or 1/8 scale (its SIMD IDCT scales; the n/8 ones measured no
faster), the largest that keeps the box at least `size` pixels on both sides, so no output pixel is interpolated
from fewer source pixels than a full decode gives; then only the box is resized (bilinear, antialiased: torch's
uint8 kernel, which torchvision's tensor transforms use, when torch is installed, else Pillow's). The decoder is
simplejpeg when installed (`pip install 'imagenet-parquet[fast]'`), else Pillow (`Image.draft`); non-JPEG bytes and
JPEGs the gate in markers.py does not pass (lossless, arithmetic, 12-bit, CMYK, unusual sampling, damaged headers)
take Pillow's full decode, with the same box. EXIF orientation is not applied (as torchvision's PIL loader). Output:
a uint8 tensor (3, size, size) with torch, else a numpy array (size, size, 3). How close the pixels are to
torchvision's: docs/trainer.md, tests/test_crops.py."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from PIL import Image

from . import turbo
from .decode import Encoded, have_simplejpeg

HAVE_TORCH: bool
try:  # torch is optional: with it, boxes come from torch's generator and the resize is torch's uint8 kernel
    import torch
    import torch.nn.functional as F

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - exercised by the no-torch test in a subprocess
    HAVE_TORCH = False

Box = tuple[int, int, int, int]  # (top, left, height, width), as torchvision's get_params returns it
DCT_DENOMINATORS = (8, 4, 2, 1)
DECODERS = ("auto", "turbojpeg", "simplejpeg", "pillow")  # auto: the first of these three that is there


class Draws(Protocol):
    """The random draws of a crop box and a flip (torch's generator, or a numpy Generator)."""

    def log_ratio(self, ratio: tuple[float, float]) -> tuple[float, float]: ...
    def uniform(self, low: float, high: float) -> float: ...
    def exp_uniform(self, low: float, high: float) -> float: ...
    def integer(self, low: int, high: int) -> int: ...
    def below(self, p: float) -> bool: ...


class TorchDraws:
    """torchvision's own draws (RandomResizedCrop.get_params, RandomHorizontalFlip), float32 steps included."""

    def __init__(self, generator: Any = None):
        self.generator = generator

    def log_ratio(self, ratio: tuple[float, float]) -> tuple[float, float]:
        return _torch_log_ratio((float(ratio[0]), float(ratio[1])))

    def uniform(self, low: float, high: float) -> float:
        return float(torch.empty(1).uniform_(low, high, generator=self.generator).item())

    def exp_uniform(self, low: float, high: float) -> float:
        return float(torch.exp(torch.empty(1).uniform_(low, high, generator=self.generator)).item())

    def integer(self, low: int, high: int) -> int:
        return int(torch.randint(low, high, size=(1,), generator=self.generator).item())

    def below(self, p: float) -> bool:
        return bool(torch.rand(1, generator=self.generator).item() < p)


@functools.cache
def _torch_log_ratio(ratio: tuple[float, float]) -> tuple[float, float]:
    """torch.log(torch.tensor(ratio)) as torchvision computes it (float32), once per ratio, not per image."""
    logs = torch.log(torch.tensor(ratio))
    return float(logs[0]), float(logs[1])


class NumpyDraws:
    """The same distribution from a numpy Generator (no torch; the GPU path's seeded boxes)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def log_ratio(self, ratio: tuple[float, float]) -> tuple[float, float]:
        return math.log(ratio[0]), math.log(ratio[1])

    def uniform(self, low: float, high: float) -> float:
        return float(self.rng.uniform(low, high))

    def exp_uniform(self, low: float, high: float) -> float:
        return math.exp(self.rng.uniform(low, high))

    def integer(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high))

    def below(self, p: float) -> bool:
        return bool(self.rng.random() < p)


def rrc_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], draws: Draws) -> Box:
    """(top, left, h, w) of a RandomResizedCrop box: torchvision's get_params, step for step."""
    area = height * width
    log_ratio = draws.log_ratio(ratio)
    for _ in range(10):
        target_area = area * draws.uniform(scale[0], scale[1])
        aspect = draws.exp_uniform(log_ratio[0], log_ratio[1])
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return draws.integer(0, height - h + 1), draws.integer(0, width - w + 1), h, w
    w, h = width, height  # fallback: the whole image, clamped to the ratio range, centred
    if width / height < min(ratio):
        h = round(w / min(ratio))
    elif width / height > max(ratio):
        w = round(h * max(ratio))
    return (height - h) // 2, (width - w) // 2, h, w


def center_box(height: int, width: int, fraction: float) -> Box:
    """(top, left, h, w) of the centred square of side `fraction` x the shorter side."""
    side = max(1, round(min(height, width) * fraction))
    return (height - side) // 2, (width - side) // 2, side, side


def eval_window(height: int, width: int, resize: int, size: int) -> tuple[float, float, float, float]:
    """Resize(resize) + CenterCrop(size) as one window of the original: (top, left, h, w), fractional. Sizes as
    torchvision computes them (shorter side = resize, longer = int(resize * longer / shorter); crop offsets
    round((new - size) / 2))."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    new_w, new_h = (resize, new_long) if width <= height else (new_long, resize)
    top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
    sy, sx = height / new_h, width / new_w
    return top * sy, left * sx, size * sy, size * sx


def dct_denominator(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps the box at least the output's size in both directions."""
    return next(d for d in DCT_DENOMINATORS if d == 1 or (box_h / d >= out_h and box_w / d >= out_w))


def crop_resized(
    image: Encoded, box: tuple[float, float, float, float], out: int, max_pixels: int | None = None
) -> Any:
    """The `box` (top, left, h, w in original pixels) of `image`, decoded at the smallest DCT scale that keeps it
    at least `out` pixels a side, resized to (out, out): uint8 (3, out, out) tensor with torch, else (out, out, 3)."""
    denominator = dct_denominator(box[2], box[3], out, out) if image.scalable else 1
    pixels, y0, x0 = image.decode(denominator, max_pixels, box)
    top, left, h, w = box[0] / denominator - y0, box[1] / denominator - x0, box[2] / denominator, box[3] / denominator
    # (libjpeg-turbo's scaled pixel k covers original pixels [k*d, (k+1)*d))
    if all(float(v).is_integer() for v in (top, left, h, w)) and HAVE_TORCH:
        y, x = int(top), int(left)
        return _resize_torch(pixels[y : y + int(h), x : x + int(w)], out)
    scaled = Image.fromarray(pixels).resize((out, out), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    return torch.from_numpy(np.array(scaled)).permute(2, 0, 1) if HAVE_TORCH else np.asarray(scaled)


def _resize_torch(window: np.ndarray, out: int) -> Any:
    """Bilinear, antialiased resize of an (h, w, 3) uint8 window to a (3, out, out) tensor: torch's uint8
    channels-last kernel (torchvision's tensor path), ~3x Pillow's resize."""
    with warnings.catch_warnings():  # Pillow's arrays are read-only; interpolate only reads them
        warnings.simplefilter("ignore", UserWarning)
        chw = torch.from_numpy(window).permute(2, 0, 1).unsqueeze(0)  # a view, channels-last
    return F.interpolate(chw, size=(out, out), mode="bilinear", antialias=True, align_corners=False)[0]


def _flipped(image: Any) -> Any:
    if HAVE_TORCH and isinstance(image, torch.Tensor):
        return image.flip(-1)
    return np.ascontiguousarray(image[:, ::-1])


def _check(size: int, pairs: dict[str, tuple[float, float]], flip: float, decoder: str) -> None:
    missing = {"turbojpeg": not turbo.available(), "simplejpeg": not have_simplejpeg()}
    if missing.get(decoder):
        raise ValueError(
            f"decoder={decoder!r}: expected it installed, found none ("
            + (
                "a libturbojpeg 3.x: install libjpeg-turbo >= 3.0 or set " + turbo.ENV + " to its path)"
                if decoder == "turbojpeg"
                else "pip install 'imagenet-parquet[fast]')"
            )
            + '; or decoder="auto"'
        )
    bad = {k: v for k, v in pairs.items() if not 0 < v[0] <= v[1]}
    if size < 1 or bad or not 0 <= flip <= 1 or decoder not in DECODERS:
        raise ValueError(
            f"expected size >= 1, 0 < low <= high for {', '.join(pairs)}, 0 <= flip <= 1 and decoder in "
            f"{DECODERS}; found size={size}, "
            + ", ".join(f"{k}={v}" for k, v in pairs.items())
            + f", flip={flip}, decoder={decoder!r}"
        )


def _draws(generator: Any) -> Draws:
    if isinstance(generator, np.random.Generator):
        return NumpyDraws(generator)
    if HAVE_TORCH:
        return TorchDraws(generator)
    return NumpyDraws(np.random.default_rng() if generator is None else np.random.default_rng(generator))


@dataclass
class TrainCrop:
    """RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip) of JPEG bytes, decoding only the scale
    the crop needs. `generator`: a torch.Generator (None: torch's global one, as torchvision; DataLoader seeds it in
    each worker), or a numpy Generator. `max_pixels`: decode_image's decompression-bomb bound. `decoder`: "auto"
    (the first there of "turbojpeg", "simplejpeg", "pillow"), or one of those."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    generator: Any = field(default=None, repr=False)
    max_pixels: int | None = None
    decoder: str = "auto"

    def __post_init__(self) -> None:
        _check(self.size, {"scale": self.scale, "ratio": self.ratio}, self.flip, self.decoder)

    def __call__(self, data: bytes) -> Any:
        image, draws = Encoded.parse(data, self.decoder), _draws(self.generator)
        box = rrc_box(image.height, image.width, self.scale, self.ratio, draws)
        out = crop_resized(image, box, self.size, self.max_pixels)
        return _flipped(out) if draws.below(self.flip) else out


@dataclass
class EvalCrop:
    """Resize(resize) + CenterCrop(size) of JPEG bytes as one window, decoded at the largest DCT scale that keeps
    the window at least `size` pixels (the shorter side at least `resize`: the resize still only shrinks)."""

    size: int = 224
    resize: int = 256
    max_pixels: int | None = None
    decoder: str = "auto"

    def __post_init__(self) -> None:
        _check(self.size, {"size..resize": (self.size, self.resize)}, 0.0, self.decoder)

    def __call__(self, data: bytes) -> Any:
        image = Encoded.parse(data, self.decoder)
        window = eval_window(image.height, image.width, self.resize, self.size)
        return crop_resized(image, window, self.size, self.max_pixels)

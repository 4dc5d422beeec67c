"""Planted near-duplicates for the near-duplicate check: the edits the issue names (re-encode q50-q90, resize
0.5-0.95, a 2-5 % border crop, a small brightness change), applied to real or sample JPEGs."""
from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageEnhance

from tests.helpers.project import SHARED

REAL_SAMPLES = SHARED / "imagenet-samples"  # 1000 distinct real ImageNet JPEGs, `<wnid>_<name>.JPEG`


def _jpeg(image: Image.Image, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _reencode(q: int) -> Callable[[Image.Image], bytes]:
    return lambda im: _jpeg(im, q)


def _resize(s: float) -> Callable[[Image.Image], bytes]:
    return lambda im: _jpeg(im.resize((round(im.width * s), round(im.height * s)), Image.Resampling.LANCZOS))


def crop(c: float) -> Callable[[Image.Image], bytes]:
    """Remove `c` of each side's length, a third from the left/top border, two thirds from the right/bottom."""
    def edit(im: Image.Image) -> bytes:
        dx, dy = round(im.width * c), round(im.height * c)
        return _jpeg(im.crop((dx // 3, dy // 3, im.width - (dx - dx // 3), im.height - (dy - dy // 3))))
    return edit


def _brightness(f: float) -> Callable[[Image.Image], bytes]:
    return lambda im: _jpeg(ImageEnhance.Brightness(im).enhance(f))


EDITS: dict[str, Callable[[Image.Image], bytes]] = {
    **{f"q{q}": _reencode(q) for q in (50, 70, 90)},
    **{f"resize{s}": _resize(s) for s in (0.5, 0.75, 0.95)},
    **{f"crop{round(c * 100, 1)}pct": crop(c) for c in (0.02, 0.035, 0.05)},
    **{f"bright{f}": _brightness(f) for f in (0.9, 1.1)},
}


def plant(data: bytes, edit: str) -> bytes:
    """`data` (a JPEG) with one of EDITS applied, re-saved as JPEG."""
    with Image.open(io.BytesIO(data)) as image:
        return EDITS[edit](image.convert("RGB"))


def real_images(count: int | None = None) -> list[tuple[str, bytes]]:
    """(wnid, bytes) of the real samples in name order, or [] without ../shared."""
    files = sorted(REAL_SAMPLES.glob("*.JPEG"))[:count] if REAL_SAMPLES.is_dir() else []
    return [(f.name.split("_", 1)[0], f.read_bytes()) for f in files]


def sample_images(release: Path, count: int) -> list[tuple[str, bytes]]:
    """(wnid, bytes) of the first `count` plain JPEGs of the built-in sample's train archive (the sample's
    quirks — CMYK, PNG, EXIF — left out), one class after the other."""
    found: list[tuple[str, bytes]] = []
    with tarfile.open(release / "ILSVRC2012_img_train.tar") as outer:
        for member in outer.getmembers():
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                for item in inner.getmembers():
                    data = inner.extractfile(item).read()
                    with Image.open(io.BytesIO(data)) as image:
                        plain = image.format == "JPEG" and image.mode == "RGB" and not image.getexif()
                    if plain and len(found) < count:
                        found.append((member.name.removesuffix(".tar"), data))
    return found

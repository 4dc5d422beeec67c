"""Image decoding: PIL, optionally with JPEG draft mode (DCT-domain downscaling) when the target size is known."""

from __future__ import annotations

import io

from PIL import Image

Size = int | tuple[int, int]


def decode_image(data: bytes, mode: str = "RGB", draft_size: Size | None = None) -> Image.Image:
    """Decode image bytes like torchvision's PIL loader (`Image.open(...).convert("RGB")`).

    With `draft_size` (an int = shorter side, or (width, height)) a JPEG is decoded at the smallest of the
    1/1, 1/2, 1/4, 1/8 scales that still keeps the image at least that large (Pillow's `Image.draft`), which is
    much faster for large JPEGs. Exact for resize-then-crop evaluation pipelines; for RandomResizedCrop it trades
    resolution inside small crops for speed. Non-JPEG images ignore it. EXIF orientation is not applied (same as
    the PIL loader); the `exif_orientation` column records it."""
    img = Image.open(io.BytesIO(data))
    if draft_size is not None and img.format == "JPEG":
        img.draft(mode, _draft_box(img.size, draft_size))
    return img.convert(mode) if img.mode != mode else _loaded(img)


def _loaded(img: Image.Image) -> Image.Image:
    img.load()
    return img


def _draft_box(size: tuple[int, int], target: Size) -> tuple[int, int]:
    """(width, height) to request from draft(): for an int, scale so the shorter side stays >= target."""
    if not isinstance(target, int):
        return int(target[0]), int(target[1])
    width, height = size
    shorter = min(width, height)
    if shorter <= target:
        return width, height
    return max(1, width * target // shorter), max(1, height * target // shorter)

"""Image decoding: PIL, optionally with JPEG draft mode (DCT-domain downscaling) when the target size is known."""

from __future__ import annotations

import io

from PIL import Image

Size = int | tuple[int, int]


def decode_image(
    data: bytes, mode: str = "RGB", draft_size: Size | None = None, max_pixels: int | None = None
) -> Image.Image:
    """Decode image bytes like torchvision's PIL loader (`Image.open(...).convert("RGB")`).

    `max_pixels` bounds the pixels decoded (after draft scaling), read from the header before any pixel is
    allocated: a larger image raises `PIL.Image.DecompressionBombError` naming both sizes, never a 432 MB
    allocation for a 12000x12000 header. None: Pillow's `Image.MAX_IMAGE_PIXELS` (89,478,485, which Pillow itself
    only warns about), unbounded only when that is None too.

    With `draft_size` (an int = shorter side, or (width, height)) a JPEG is decoded at the smallest of the
    1/1, 1/2, 1/4, 1/8 scales that still keeps the image at least that large (Pillow's `Image.draft`), which is
    much faster for large JPEGs. Exact for resize-then-crop evaluation pipelines; for RandomResizedCrop it trades
    resolution inside small crops for speed. Non-JPEG images ignore it. EXIF orientation is not applied (same as
    the PIL loader); the `exif_orientation` column records it."""
    img = Image.open(io.BytesIO(data))
    if draft_size is not None and img.format == "JPEG":
        img.draft(mode, _draft_box(img.size, draft_size))
    _check_pixels(img.size, Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels)
    return img.convert(mode) if img.mode != mode else _loaded(img)


def _check_pixels(size: tuple[int, int], limit: int | None) -> None:
    width, height = size
    if limit is not None and width * height > limit:
        raise Image.DecompressionBombError(
            f"image of {width}x{height} = {width * height:,} pixels to decode, more than max_pixels={limit:,} "
            "(a decompression bomb?); pass a draft_size to decode it smaller, or a larger max_pixels if it is real"
        )


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

"""Image decoding: PIL, optionally with JPEG draft mode (DCT-domain downscaling) when the target size is known;
`Encoded`: an image's header read first, then its pixels decoded at a chosen DCT scale (crops.py). Only JPEGs the
gate in markers.py passes reach TurboJPEG, simplejpeg or a DCT scale; the rest are Pillow's, at full scale."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from . import markers, turbo

try:  # libjpeg-turbo bundled in a wheel (`pip install 'imagenet-parquet[fast]'`): faster than Pillow's decode path
    import simplejpeg
except ImportError:
    simplejpeg = None

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
    the PIL loader); the `exif_orientation` column records it. A JPEG the gate (markers.py) does not pass, e.g. a
    lossless one, is decoded at full scale: libjpeg-turbo's scaled decode of those is not safe."""
    img = Image.open(io.BytesIO(data))
    frame = markers.read_frame(data) if img.format == "JPEG" else None
    if draft_size is not None and frame is not None and frame.problem is None:
        img.draft(mode, _draft_box(img.size, draft_size))  # what markers.draft does, the frame kept
    _check_pixels(img.size, Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels)
    _check_data(frame)
    return img.convert(mode) if img.mode != mode else _loaded(img)


def _check_pixels(size: tuple[int, int], limit: int | None) -> None:
    width, height = size
    if limit is not None and width * height > limit:
        raise Image.DecompressionBombError(
            f"image of {width}x{height} = {width * height:,} pixels to decode, more than max_pixels={limit:,} "
            "(a decompression bomb?); pass a draft_size to decode it smaller, or a larger max_pixels if it is real"
        )


def _check_data(frame: markers.Frame | None) -> None:
    if frame is not None and frame.short:
        raise OSError(frame.short)


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


def have_simplejpeg() -> bool:
    return simplejpeg is not None


class ImageDecodeError(OSError):
    """A reader's image that no decoder could decode: the message names the shard and the row (the decoder's own
    error is its __cause__)."""


@dataclass
class Encoded:
    """Image bytes with their size read from the header (nothing decoded yet), and the decoder that will decode them."""

    data: bytes
    width: int
    height: int
    scalable: bool  # a JPEG the gate passes (markers.py): decoded at a DCT scale; else at full scale, by Pillow
    opened: Image.Image | None = None  # Pillow's parse, when Pillow read the header
    backend: str = "pillow"  # turbojpeg (region decode) | simplejpeg | pillow
    short: str | None = None  # markers.Frame.short: decode raises it

    @classmethod
    def parse(cls, data: bytes, decoder: str = "auto") -> Encoded:
        """The header of `data`: a JPEG the gate passes (markers.py: its size from its own frame header) goes to
        the first there of TurboJPEG 3 (turbo.py) and simplejpeg (`decoder` "auto"), or to the one named;
        anything else (and `decoder` "pillow") is read by Pillow, whose errors are decode_image's."""
        frame = markers.read_frame(data)
        if frame is not None and frame.problem is None:
            if decoder in ("auto", "turbojpeg") and turbo.available():
                return cls(data, frame.width, frame.height, True, None, "turbojpeg")
            if decoder in ("auto", "simplejpeg") and simplejpeg is not None:
                return cls(data, frame.width, frame.height, True, None, "simplejpeg")
        img = Image.open(io.BytesIO(data))
        native = frame is not None and frame.problem is None and img.format == "JPEG"
        return cls(data, img.size[0], img.size[1], native, img, short=frame.short if frame else None)

    def decode(
        self, denominator: int = 1, max_pixels: int | None = None, box: tuple[float, float, float, float] | None = None
    ) -> tuple[np.ndarray, int, int]:
        """RGB uint8 pixels at 1/`denominator` scale (1, 2, 4 or 8 for a JPEG, else 1): the whole image, or with
        TurboJPEG only `box` (top, left, h, w in original pixels) widened to whole scaled pixels; with the scaled
        (y, x) of the pixels' corner. `max_pixels` bounds the scaled image's pixels, as in decode_image."""
        limit = Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
        rows, cols = -(-self.height // denominator), -(-self.width // denominator)
        _check_pixels((cols, rows), limit)
        if self.short:
            raise OSError(self.short)
        if self.backend == "turbojpeg":
            try:
                whole = (0, 0, self.height, self.width)
                return turbo.decode_region(self.data, denominator, box or whole, (self.width, self.height))
            except turbo.TurboError:  # refused after its header passed: Pillow decides
                pass
        if self.backend == "simplejpeg":
            try:
                pixels: np.ndarray = simplejpeg.decode_jpeg(self.data, "RGB", min_height=rows, min_width=cols)
                if pixels.shape[:2] == (rows, cols):
                    return pixels, 0, 0
            except ValueError:  # data libjpeg-turbo calls corrupt where Pillow may not: Pillow decides
                pass
        img, self.opened = self.opened or Image.open(io.BytesIO(self.data)), None  # a parse serves one decode
        if denominator > 1 and self.scalable:
            img.draft("RGB", (self.width // denominator, self.height // denominator))
        return np.asarray(img.convert("RGB") if img.mode != "RGB" else _loaded(img)), 0, 0

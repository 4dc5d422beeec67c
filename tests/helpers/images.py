"""Small image payloads for the tests: every test that needs image bytes takes them from here."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image


def _encoded(image: Image.Image, fmt: str = "JPEG", **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


def jpeg(color=(200, 30, 40), size=(64, 48), mode="RGB", fmt="JPEG", **save) -> bytes:
    """A solid-colour image in `mode`, saved as `fmt` (JPEG unless told: PNG, GIF...) with Pillow's `save` options."""
    return _encoded(Image.new("RGB", size, color).convert(mode), fmt, **save)


def noisy_jpeg(seed: int, size=(96, 72), quality: int = 80) -> bytes:
    """A JPEG of random pixels: unique and deterministic per seed, and hardly compressible."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return _encoded(Image.fromarray(pixels), quality=quality)


def fake_jpeg(seed: int) -> bytes:
    """Distinct bytes that start like a JPEG but are none (for the extract stage, which never decodes images)."""
    return b"\xff\xd8\xff\xe0" + bytes([seed % 251]) * (700 + seed * 37 % 900) + seed.to_bytes(4, "big")


def indexed_jpeg(index: int, noise_px: int = 0, seed: int = 0) -> bytes:
    """An 8x8 solid JPEG whose colour encodes `index` (< 4096; `identify` reads it back); `noise_px` > 0: a large
    incompressible image with that colour in its top-left 8x8 corner."""
    colour = ((index % 64) * 4, (index // 64) * 4, 128)
    if noise_px:
        pixels = np.random.default_rng([seed, index]).integers(0, 256, (noise_px, noise_px, 3), dtype=np.uint8)
        pixels[:8, :8] = colour
        image = Image.fromarray(pixels)
    else:
        image = Image.new("RGB", (8, 8), colour)
    return _encoded(image, quality=95)


def identify(image: Image.Image) -> int:
    """The index an `indexed_jpeg` image encodes."""
    red, green, _ = image.getpixel((3, 3))
    return round(red / 4) + 64 * round(green / 4)

"""A 64-bit perceptual fingerprint (DCT hash, "pHash") of an image's stored bytes, for near-duplicate search.

The picture is decoded at a reduced scale (JPEG DCT scaling via `Image.draft`: the strongest of 1/2..1/8 that keeps
both sides >= 64 px; full scale for what the reader's decoder gate refuses, e.g. a lossless JPEG), turned to
32 x 32 grey (Hamming filter: the most resize- and crop-stable of the filters measured), and the 8 x 8 lowest
frequencies of its 2-D DCT-II after the first row and column (u, v = 1..8, as
pHash's ph_dct_imagehash: the DC term (0, 0), the mean brightness, is far above every other coefficient, so
`dct64-v1`, which took u, v = 0..7 like `imagehash.phash`, had its top bit 1 for every image) are compared with
their median: bit i (row-major, most significant first) is 1 where coefficient i is above it, so half the bits are
set and each carries information. Re-encoding, resizing, a small border crop or a brightness change move few bits;
distinct photos differ in ~32. Own numpy code rather than `imagehash.phash`: ~2.6x less CPU per image, from the
reduced decode (85 % of what remains is libjpeg's entropy decoding, which no scale skips), the 64 informative bits,
and no extra dependency (benchmarks/bench_near_dup.py measures both)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from imagenet_parquet.markers import draft
from tasks.convert.imaging import BadImage

HASH_SIDE = 8  # 8 x 8 coefficients = 64 bits
GRID = 32  # the grey picture the DCT runs on


def _dct_rows(n: int, k: int) -> np.ndarray:
    """The first `k` rows of the orthonormal n-point DCT-II matrix."""
    x = np.arange(n)
    rows: np.ndarray = np.cos(np.pi * (2 * x[None, :] + 1) * np.arange(k)[:, None] / (2 * n)) * np.sqrt(2 / n)
    rows[0] /= np.sqrt(2)
    return rows


_DCT = _dct_rows(GRID, HASH_SIDE + 1)[1:]  # frequencies 1..HASH_SIDE: the DC row and column left out
MIDDLE = (HASH_SIDE * HASH_SIDE // 2 - 1, HASH_SIDE * HASH_SIDE // 2)  # the two middle ranks: their mean is the median


def grey_grid(data: bytes | memoryview) -> np.ndarray:
    """The image as GRID x GRID float grey levels, from a reduced decode (raises what Pillow raises)."""
    with Image.open(io.BytesIO(data)) as image:
        draft(image, data, "L", (GRID * 2, GRID * 2))  # JPEGs the reader's decoder gate passes, only
        grey = image.convert("L").resize((GRID, GRID), Image.Resampling.HAMMING)
    return np.asarray(grey, dtype=np.float64)


def fingerprint_pixels(pixels: np.ndarray) -> int:
    """The 64-bit hash of a GRID x GRID grey array."""
    low = (_DCT @ pixels @ _DCT.T).ravel()
    middle = np.partition(low, MIDDLE)[list(MIDDLE)]
    bits = low > (middle[0] + middle[1]) / 2  # above the median of the 64 (np.median, without its overhead)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def fingerprint(data: bytes | memoryview) -> int:
    """The perceptual fingerprint of encoded image bytes, as an unsigned 64-bit int (0 <= value < 2**64)."""
    return fingerprint_pixels(grey_grid(data))


def stored_fingerprint(data: bytes) -> int:
    """`fingerprint` of the bytes a shard stores; bytes Pillow cannot decode are a BadImage (quarantined)."""
    try:
        return fingerprint(data)
    except Exception as err:  # any decoder failure: the image is unusable for a loader too
        raise BadImage(f"undecodable: fingerprint decode failed: {type(err).__name__}: {err}") from None

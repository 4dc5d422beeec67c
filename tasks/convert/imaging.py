"""Encoding policy for one image: keep the archive's bytes when they are a clean JPEG, change only what must change.

`encode_image(data, policy)` returns the bytes to store plus what was found and done, or raises `BadImage` with a
short reason (the image is then quarantined, never written).

A JPEG must hold at least one bit of entropy-coded data per 8x8 block it declares (every block starts with a
Huffman-coded DC difference, and a Huffman code is at least one bit long): fewer bytes of entropy-coded data than
`blocks / 8` cannot be a complete image, whatever its content — a tiny file declaring huge dimensions (678 bytes for
12000x12000, which a loader would inflate to 432 MB) is quarantined as `implausible_size` instead of being stored
byte-for-byte. Only the scans' data counts (tasks.convert.jpeg_header.entropy_coded_bytes), never the file size: the
same header padded with 281 KB of comments or APPn segments is quarantined too."""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps

from tasks.convert.jpeg_header import entropy_coded_bytes, first_scan, read_header

ORIENTATION_TAG = 0x0112
# Steps are named in the vocabulary of imagenet_parquet.format.TRANSFORM_PATTERN (validate checks shards against it).
PASSTHROUGH_MODES = ("RGB", "L")  # JPEG modes every loader reads as-is (L: grayscale)
MIN_BITS_PER_BLOCK = 1  # entropy-coded bits per 8x8 block a JPEG needs at least (module docstring)


class BadImage(ValueError):
    """The bytes are not a usable image; `str(err)` is the reason recorded in bad_images.jsonl."""


@dataclass(frozen=True)
class Policy:
    """What to do with each image (the output-relevant part of params.yaml `convert:`)."""

    policy: str = "passthrough"  # passthrough | reencode
    quality: int = 90
    resize_shorter: int | None = None
    max_side: int | None = None  # longer side bounded (e.g. 320: a small training copy); None: no bound
    exif: str = "keep"  # keep | transpose
    max_image_pixels: int = 178956970
    full_decode: bool = False  # also decode images stored byte-for-byte (catches corrupt entropy data)


@dataclass(frozen=True)
class Encoded:
    data: bytes
    width: int
    height: int
    source_format: str
    transform: str
    exif_orientation: int


def encode_image(data: bytes, policy: Policy) -> Encoded:
    """Apply `policy` to one image's bytes (see the module docstring)."""
    if not data:
        raise BadImage("empty: 0 bytes")
    kept = _keep_as_is(data, policy)
    if kept is not None:
        return kept
    im = _open(data, policy.max_image_pixels)
    fmt = im.format or "unknown"
    orientation = _orientation(im)
    steps = _needed_steps(im, fmt, orientation, policy)
    if fmt == "JPEG":
        _require_plausible_size(data, im.width, im.height, first_scan(data))
    if steps is None:
        if fmt == "JPEG":
            _require_end_marker(data)
        if policy.full_decode:
            _load(im)
        return Encoded(data, im.width, im.height, fmt, "none", orientation)
    _load(im)
    return _reencode(im, fmt, orientation, steps, policy)


def _keep_as_is(data: bytes, policy: Policy) -> Encoded | None:
    """Fast path without Pillow: a plain RGB/grayscale JPEG that the policy keeps untouched (None = ask Pillow)."""
    head = read_header(data)
    if head is None or policy.policy != "passthrough" or policy.full_decode:
        return None
    if head.width * head.height > policy.max_image_pixels:
        return None  # Pillow's path reports it
    _require_plausible_size(data, head.width, head.height, head.scan)
    if (policy.exif == "transpose" and head.orientation != 1) or _bound(head.width, head.height, policy):
        return None
    _require_end_marker(data)
    return Encoded(data, head.width, head.height, "JPEG", "none", head.orientation)


def _open(data: bytes, max_pixels: int) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as err:
        raise BadImage(f"decompression_bomb: {err}") from None
    except Exception as err:  # Pillow raises UnidentifiedImageError, SyntaxError, struct.error...
        raise BadImage(f"not_an_image: {_describe(err)}") from None
    if im.width * im.height > max_pixels:
        raise BadImage(f"decompression_bomb: {im.width}x{im.height} pixels > max_image_pixels={max_pixels}")
    if im.width < 1 or im.height < 1:
        raise BadImage(f"undecodable: size {im.width}x{im.height}")
    return im


def _load(im: Image.Image) -> None:
    try:
        im.load()
    except Exception as err:
        reason = "truncated" if "truncated" in str(err) else "undecodable"
        raise BadImage(f"{reason}: {_describe(err)}") from None


def _describe(err: Exception) -> str:
    """`Type: message` without object addresses (bad_images.jsonl must be byte-identical across runs)."""
    return f"{type(err).__name__}: " + re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "<bytes>", str(err))


def _orientation(im: Image.Image) -> int:
    """EXIF orientation found (1 when absent or outside the valid 1..8, which loaders ignore too)."""
    try:
        value = im.getexif().get(ORIENTATION_TAG, 1)
    except Exception:
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _require_end_marker(data: bytes) -> None:
    """A complete JPEG has EOI (FFD9) after its last SOS (FFDA); neither can occur inside entropy-coded data."""
    if not (data.endswith(b"\xff\xd9") or data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda")):
        raise BadImage("truncated: no JPEG end-of-image marker after the last scan")


def _require_plausible_size(data: bytes, width: int, height: int, scan: int | None) -> None:
    """At least MIN_BITS_PER_BLOCK bits of entropy-coded data (from `scan`, the first scan's data; None: the
    whole file) per 8x8 block declared (module docstring), or BadImage."""
    blocks = -(-width // 8) * -(-height // 8)
    enough = -(-blocks * MIN_BITS_PER_BLOCK // 8)  # the fewest whole bytes that pass
    coded = len(data) if scan is None else entropy_coded_bytes(data, scan, enough)
    if coded * 8 < blocks * MIN_BITS_PER_BLOCK:
        raise BadImage(
            f"implausible_size: {width}x{height} declared ({blocks} 8x8 blocks, at least {blocks // 8} bytes of "
            f"image data), found {coded} bytes of image data in a {len(data)}-byte file"
        )


def _needed_steps(im: Image.Image, fmt: str, orientation: int, policy: Policy) -> list[str] | None:
    """Steps (in the contract's vocabulary) before the final JPEG encode; None = keep the bytes untouched."""
    convert = [] if fmt == "JPEG" else [f"{fmt.lower()}_to_jpeg"]
    later = []
    if policy.exif == "transpose" and orientation != 1:
        later.append("exif_transpose")
    bound = _bound(*im.size, policy)  # min() and max() are orientation-independent
    if bound:
        later.append(bound[1])
    encode = convert or later or policy.policy == "reencode" or im.mode not in PASSTHROUGH_MODES
    if not encode:
        return None
    if im.mode != "RGB":  # anything we encode is encoded as RGB
        convert.append("cmyk_to_rgb" if im.mode == "CMYK" else "to_rgb")
    return convert + later


def _reencode(im: Image.Image, fmt: str, orientation: int, steps: list[str], policy: Policy) -> Encoded:
    icc = im.info.get("icc_profile") if im.mode == "RGB" else None  # a CMYK/other profile would lie about RGB
    if "exif_transpose" in steps:
        im = ImageOps.exif_transpose(im)
    if im.mode != "RGB":
        im = im.convert("RGB")
    bound = _bound(*im.size, policy)  # the step _needed_steps named (same sizes, maybe transposed)
    if bound:
        im = _resize(im, bound[0])
    out = io.BytesIO()
    im.save(out, format="JPEG", quality=policy.quality, icc_profile=icc, optimize=False, progressive=False)
    done = [*steps, f"reencode_q{policy.quality}"]
    return Encoded(out.getvalue(), im.width, im.height, fmt, "+".join(done), orientation)


def _bound(width: int, height: int, policy: Policy) -> tuple[float, str] | None:
    """(scale < 1, step) of the one resize an image of this size takes, or None when it fits every bound: the
    tighter of `resize_shorter` (shorter side to it: `resize_<n>`) and `max_side` (longer side to it: `max_side_<n>`),
    so the result meets both; on a tie `resize_<n>` names it. Both bounds only ever shrink."""
    bounds = []
    if policy.resize_shorter and min(width, height) > policy.resize_shorter:
        bounds.append((policy.resize_shorter / min(width, height), f"resize_{policy.resize_shorter}"))
    if policy.max_side and max(width, height) > policy.max_side:
        bounds.append((policy.max_side / max(width, height), f"max_side_{policy.max_side}"))
    return min(bounds, key=lambda bound: bound[0]) if bounds else None


def _resize(im: Image.Image, scale: float) -> Image.Image:
    """Both sides times `scale` (< 1; Lanczos, with Pillow's reducing_gap pre-reduction for speed): the bounded
    side lands on its bound exactly, the other within half a pixel of the aspect ratio."""
    w, h = im.size
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return im.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)

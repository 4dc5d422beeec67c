"""The passthrough fast path's JPEG header reader agrees with Pillow, and defers to it on anything unusual."""
from __future__ import annotations

import io
import struct

import pytest
from PIL import Image

from tasks.convert.imaging import BadImage, Policy, encode_image
from tasks.convert.jpeg_header import read_header
from tests.helpers.images import jpeg, noisy_jpeg


def _pillow_view(data: bytes) -> tuple[int, int, int, int]:
    im = Image.open(io.BytesIO(data))
    orientation = im.getexif().get(0x0112, 1)
    return im.width, im.height, {"L": 1, "RGB": 3}[im.mode], orientation if 1 <= orientation <= 8 else 1


def _with_exif(data: bytes, tiff: bytes) -> bytes:
    segment = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + data[2:]


def _tiff(order: str, orientation: int) -> bytes:
    head = b"II*\x00" if order == "<" else b"MM\x00*"
    return head + struct.pack(order + "IH", 8, 1) + struct.pack(order + "HHIHH", 0x0112, 3, 1, orientation, 0) + \
        struct.pack(order + "I", 0)


@pytest.mark.parametrize("data", [
    jpeg(size=(31, 17)), jpeg(mode="L", size=(5, 900)), jpeg(progressive=True, size=(640, 480)),
    _with_exif(jpeg(), _tiff("<", 6)), _with_exif(jpeg(), _tiff(">", 8)), _with_exif(jpeg(), _tiff(">", 0)),
    noisy_jpeg(3),
], ids=["rgb", "gray", "progressive", "exif-le-6", "exif-be-8", "exif-invalid-0", "noisy"])
def test_header_matches_pillow(data):
    head = read_header(data)
    assert head is not None and (head.width, head.height, head.components, head.orientation) == _pillow_view(data)


@pytest.mark.parametrize("data", [b"", b"\xff\xd8", jpeg(mode="CMYK"), jpeg(fmt="PNG"), b"\xff\xd8\xff\xe0\x00",
                                  jpeg()[:20], _with_exif(jpeg(), b"XX*\x00garbage")])
def test_unusual_or_broken_headers_defer_to_pillow(data):
    assert read_header(data) is None


def test_fast_path_and_pillow_path_agree_on_every_field():
    data = _with_exif(noisy_jpeg(5), _tiff("<", 3))
    fast = encode_image(data, Policy())
    slow = encode_image(data, Policy(full_decode=True))  # full_decode skips the fast path
    assert fast == slow and fast.data is data and fast.transform == "none"
    with pytest.raises(BadImage, match="truncated"):
        encode_image(data[:-2], Policy())


def test_real_samples_agree_with_pillow(shared_data):
    files = sorted((shared_data / "imagenet-samples").glob("*.JPEG"))
    assert len(files) >= 100
    for path in files:
        data = path.read_bytes()
        head = read_header(data)
        assert head is not None and (head.width, head.height, head.components, head.orientation) == \
            _pillow_view(data), path.name

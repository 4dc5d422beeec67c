"""Decode one region of a JPEG at a DCT scale with libjpeg-turbo's TurboJPEG 3 API (ctypes; no build step).

`tj3SetCroppingRegion` + `tj3SetScalingFactor` + `tj3Decompress8`: the rows above the region are skipped without
their inverse DCT and colour conversion, the rows below are never read, and columns outside it are cut at iMCU
boundaries — the crop-window decode DALI's CPU path does. No well-kept Python package exposes it (PyTurboJPEG and
simplejpeg decode whole images; PyTurboJPEG's `crop` is a lossless transform), and the library must be 3.0 or
newer, which no pip wheel of a maintained package ships; so this module binds the eight functions it needs and is
used only where such a library is found: `IMAGENET_PARQUET_TURBOJPEG` (a path to libturbojpeg.so.0), else the
system's (`ctypes.util.find_library("turbojpeg")`: conda-forge libjpeg-turbo, Debian 13, Ubuntu 25.04, Fedora 40,
Homebrew). Without one, `available()` is False and crops.py decodes with simplejpeg or Pillow.

TurboJPEG keeps its own error state (setjmp inside the library), so a corrupt JPEG returns an error code here,
never a longjmp through Python. An error or a warning (a truncated file, corrupt data) is TurboError: the caller
leaves such bytes to Pillow, which decides as decode_image does (an image, or its error). Only JPEGs the gate in
markers.py passes are handed to it (decode.py), and its header must agree with their frame header."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

import numpy as np

from . import markers

ENV = "IMAGENET_PARQUET_TURBOJPEG"
TJINIT_DECOMPRESS = 1
TJPARAM_SUBSAMP, TJPARAM_JPEGWIDTH, TJPARAM_JPEGHEIGHT, TJPARAM_COLORSPACE = 4, 5, 6, 8
TJPF_RGB = 0
MCU_WIDTH = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8}  # tjMCUWidth by TJSAMP: 444, 422, 420, GRAY, 440, 411, 441
RGB_COLORSPACES = (0, 1, 2)  # TJCS_RGB, TJCS_YCbCr, TJCS_GRAY: libjpeg-turbo converts these to RGB (not CMYK/YCCK)


class TurboError(ValueError):
    """TurboJPEG refused the bytes or the region (crops.py then decodes with another decoder)."""


class _Scaling(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    handle, buf, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "tj3Init": (handle, [ctypes.c_int]),
        "tj3Destroy": (None, [handle]),
        "tj3DecompressHeader": (ctypes.c_int, [handle, buf, size]),
        "tj3Get": (ctypes.c_int, [handle, ctypes.c_int]),
        "tj3SetScalingFactor": (ctypes.c_int, [handle, _Scaling]),
        "tj3SetCroppingRegion": (ctypes.c_int, [handle, _Region]),
        "tj3Decompress8": (ctypes.c_int, [handle, buf, size, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
        "tj3GetErrorStr": (ctypes.c_char_p, [handle]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)  # AttributeError: not a TurboJPEG 3 library
        function.restype, function.argtypes = restype, argtypes
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The TurboJPEG 3 library of this process, or None (none found, or one without the 3.x API)."""
    path = os.environ.get(ENV) or ctypes.util.find_library("turbojpeg")
    if not path:
        return None
    try:
        return _bind(ctypes.CDLL(path))
    except (OSError, AttributeError):
        return None


def available() -> bool:
    return library() is not None


class _Handle:
    """A decompressor, destroyed with its owner."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib, self.handle = lib, lib.tj3Init(TJINIT_DECOMPRESS)

    def __del__(self) -> None:
        if self.handle:
            self.lib.tj3Destroy(self.handle)


_local = threading.local()  # one decompressor per thread: a TurboJPEG handle is not thread-safe


def _session() -> tuple[ctypes.CDLL, int]:
    lib = library()
    if lib is None:
        raise TurboError("no TurboJPEG 3 library")
    own: _Handle | None = getattr(_local, "own", None)
    if own is None or own.lib is not lib:
        own = _local.own = _Handle(lib)
    if not own.handle:
        raise TurboError("tj3Init failed")
    return lib, own.handle


def header(data: bytes, size: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """(width, height, subsampling) of a JPEG that TurboJPEG decodes to RGB, else TurboError. `size`: the
    (width, height) its own frame header gives (markers.py; read here when None). tj3DecompressHeader returns 0
    for bytes it cannot parse ("Premature end of JPEG file", a warning) and leaves the previous image's header in
    the handle (libjpeg-turbo 3.0): a size other than the frame's is that, and refused."""
    if size is None:
        size = markers.native_size(data)
    lib, handle = _session()
    if lib.tj3DecompressHeader(handle, data, len(data)) != 0:
        raise TurboError(lib.tj3GetErrorStr(handle).decode(errors="replace"))
    if lib.tj3Get(handle, TJPARAM_COLORSPACE) not in RGB_COLORSPACES:
        raise TurboError("CMYK/YCCK: not converted to RGB by libjpeg-turbo")
    width, height = lib.tj3Get(handle, TJPARAM_JPEGWIDTH), lib.tj3Get(handle, TJPARAM_JPEGHEIGHT)
    if (width, height) != size:
        raise TurboError(f"header of {width}x{height} read, the frame says {size}: not a JPEG the gate passes")
    return width, height, lib.tj3Get(handle, TJPARAM_SUBSAMP)


def decode_region(
    data: bytes, denominator: int, box: tuple[float, float, float, float], size: tuple[int, int] | None = None
) -> tuple[np.ndarray, int, int]:
    """RGB uint8 pixels of `box` (top, left, h, w in original pixels) decoded at 1/`denominator` scale, widened to
    whole scaled pixels and, on the left, to the scaled iMCU boundary; with the scaled (y, x) of its corner.
    `size`: as for header()."""
    width, height, subsampling = header(data, size)
    lib, handle = _session()
    rows, cols = -(-height // denominator), -(-width // denominator)
    mcu = max(1, MCU_WIDTH.get(subsampling, 8) // denominator)
    top, left, h, w = box
    y0, x0 = int(top // denominator), int(left // denominator)
    x0 -= x0 % mcu
    y1, x1 = min(rows, -int(-(top + h) // denominator)), min(cols, -int(-(left + w) // denominator))
    if (
        lib.tj3SetScalingFactor(handle, _Scaling(1, denominator)) != 0
        or lib.tj3SetCroppingRegion(handle, _Region(x0, y0, x1 - x0, y1 - y0)) != 0
    ):
        raise TurboError(lib.tj3GetErrorStr(handle).decode(errors="replace"))
    pixels = np.empty((y1 - y0, x1 - x0, 3), dtype=np.uint8)
    if lib.tj3Decompress8(handle, data, len(data), pixels.ctypes.data, 0, TJPF_RGB) != 0:
        raise TurboError(lib.tj3GetErrorStr(handle).decode(errors="replace"))  # a warning too: Pillow decides
    return pixels, y0, x0

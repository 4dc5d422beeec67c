"""A TurboJPEG 3 library for the tests of the region decode (imagenet_parquet/turbo.py): the system's when it has
one, else the one bundled in the `turbojpeg` wheel (test extra; libjpeg-turbo 3.0 beta, built 2023-08), which is
only a carrier of the shared library here: its Python module is never imported."""
from __future__ import annotations

import ctypes.util
import importlib.util
from pathlib import Path


def bundled_library() -> str | None:
    """Path of the libturbojpeg the `turbojpeg` wheel ships (turbojpeg.libs/), or None."""
    spec = importlib.util.find_spec("turbojpeg")
    if spec is None or spec.origin is None:
        return None
    found = sorted((Path(spec.origin).parent / "turbojpeg.libs").glob("libturbojpeg*.so*"))
    return str(found[0]) if found else None


def library_path() -> str | None:
    """A libturbojpeg with the TurboJPEG 3 API: the system's, else the bundled one."""
    system = ctypes.util.find_library("turbojpeg")
    if system:
        try:
            ctypes.CDLL(system).tj3Init  # noqa: B018 - an AttributeError means a 2.x library
            return system
        except (OSError, AttributeError):
            pass
    return bundled_library()

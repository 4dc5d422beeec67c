"""A TurboJPEG 3 library for the tests of the region decode (imagenet_parquet/turbo.py): the one the reader finds
(the system's) when it has the 3.x API, else the one bundled in the `turbojpeg` wheel (test extra; libjpeg-turbo 3.0
beta, built 2023-08), which is only a carrier of the shared library here: its Python module is never imported."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from imagenet_parquet import turbo


def bundled_library() -> str | None:
    """Path of the libturbojpeg the `turbojpeg` wheel ships (turbojpeg.libs/), or None."""
    spec = importlib.util.find_spec("turbojpeg")
    if spec is None or spec.origin is None:
        return None
    found = sorted((Path(spec.origin).parent / "turbojpeg.libs").glob("libturbojpeg*.so*"))
    return str(found[0]) if found else None


def use_a_library() -> None:
    """Point the reader (turbo.ENV, inherited by every child process) at the bundled library when it finds no
    TurboJPEG 3 of its own and the environment names none."""
    if turbo.ENV in os.environ or turbo.available():
        return
    bundled = bundled_library()
    if bundled:
        os.environ[turbo.ENV] = bundled
        turbo.library.cache_clear()

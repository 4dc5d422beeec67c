"""The manifests (extract -> convert, validate): one row per image, where its bytes lie (docs/CONTRACTS.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

MANIFEST_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("label", pa.int64()),
        ("wnid", pa.string()),
        ("name", pa.string()),
        ("source", pa.string()),
        ("member", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
    ]
)


def manifest_path(manifests_dir: str | os.PathLike[str], split: str) -> Path:
    """The manifest of `split` (written by extract)."""
    return Path(manifests_dir) / f"{split}.parquet"

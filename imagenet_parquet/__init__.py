"""imagenet-parquet reader: import without Prefect or DVC (needs pyarrow, pillow, numpy; torch optional).

    from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler

The dataset classes are loaded on first use, so `import imagenet_parquet` stays cheap; they subclass
torch.utils.data.Dataset / IterableDataset / Sampler when torch is installed and are plain classes otherwise.
"""
from __future__ import annotations

from typing import Any

from .decode import decode_image
from .shards import find_shards, load_label_map

__all__ = ["ParquetImageDataset", "ParquetIterableDataset", "RowGroupSampler", "decode_image", "find_shards",
           "load_label_map", "shuffle_buffer"]
_LAZY = {"ParquetImageDataset", "ParquetIterableDataset", "RowGroupSampler", "shuffle_buffer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import datasets

        return getattr(datasets, name)
    raise AttributeError(f"module 'imagenet_parquet' has no attribute {name!r}")

"""imagenet-parquet reader: import without Prefect or DVC (needs pyarrow, pillow, numpy; torch optional).

    from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler

The dataset classes are loaded on first use, so `import imagenet_parquet` stays cheap; they subclass
torch.utils.data.Dataset / IterableDataset / Sampler when torch is installed and are plain classes otherwise.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "EvalCrop",
    "ParquetImageDataset",
    "ParquetIterableDataset",
    "RowGroupSampler",
    "TrainCrop",
    "decode_image",
    "find_shards",
    "load_label_map",
    "shuffle_buffer",
]
# name -> (module, attribute): nothing is imported until used, so `imagenet_parquet.format` (which the pipeline's
# convert and validate stages import) loads only itself.
_LAZY = {
    "TrainCrop": ("crops", "TrainCrop"),
    "EvalCrop": ("crops", "EvalCrop"),
    "ParquetImageDataset": ("datasets", "ParquetImageDataset"),
    "ParquetIterableDataset": ("datasets", "ParquetIterableDataset"),
    "RowGroupSampler": ("samplers", "RowGroupSampler"),
    "shuffle_buffer": ("samplers", "shuffle_buffer"),
    "decode_image": ("decode", "decode_image"),
    "find_shards": ("shards", "find_shards"),
    "load_label_map": ("format", "read_label_map"),
}

if TYPE_CHECKING:
    from .crops import EvalCrop, TrainCrop
    from .datasets import ParquetImageDataset, ParquetIterableDataset
    from .decode import decode_image
    from .format import read_label_map as load_label_map
    from .samplers import RowGroupSampler, shuffle_buffer
    from .shards import find_shards


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    raise AttributeError(f"module 'imagenet_parquet' has no attribute {name!r}")

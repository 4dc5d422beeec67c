"""PyTorch-style datasets over the Parquet shards (torch optional: without it they are plain Python classes).

* `ParquetImageDataset`: map-style, `ds[i] -> (image, label)`; reads the image with one `pread` through the
  shard footer's per-row byte index (labels read once per file); for shards without that index it reads the row
  group holding `i` (image bytes and label columns) and keeps the most recent `cache_row_groups` per process.
* `ParquetIterableDataset`: streams whole row groups in a (seed, epoch)-shuffled order through a shuffle buffer,
  split across distributed ranks and DataLoader workers with no duplicate and no missing row (see partition.py).
* `RowGroupSampler`: a sampler for the map-style dataset that shuffles row groups, then rows inside a small window
  of row groups, so the row-group cache hits (for shards without the footer index a plain random sampler reads
  one row group per sample; with it, any order costs one pread per sample).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from .decode import Size, decode_image
from .format import read_label_map
from .partition import rank_range, row_slices, split_range, unit_order
from .shards import IndexedReader, RowGroupReader, ShardIndex, Source, find_shards

if TYPE_CHECKING:  # type checkers see the torch bases (torch is installed where the code is checked)
    from torch.utils.data import Dataset, IterableDataset, Sampler

    _MapBase = Dataset[tuple[Any, Any]]
    _IterBase = IterableDataset[tuple[Any, Any]]
    _SamplerBase = Sampler[int]
else:
    try:  # torch is optional: subclass its Dataset types when present so DataLoader/samplers treat us natively
        from torch.utils.data import Dataset as _MapBase
        from torch.utils.data import IterableDataset as _IterBase
        from torch.utils.data import Sampler as _SamplerBase
    except ImportError:  # pragma: no cover - exercised by the no-torch import test in a subprocess
        _MapBase = _IterBase = _SamplerBase = object

READ_COLUMNS = ("image.bytes", "label")


def _worker() -> tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker; (0, 1) in the main process."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit rank/world_size, else torch.distributed's when initialised, else (0, 1)."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if rank is not None or world_size is not None:
        raise ValueError(f"rank and world_size: expected both or neither, found rank={rank}, world_size={world_size}")
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _ShardedImages:
    """What both datasets share: shard index, label map, decoding and transforms."""

    def __init__(
        self,
        source: Source,
        split: str | None,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[int], Any] | None,
        draft_size: Size | None,
        decode: bool,
        label_map: Any,
        cache_row_groups: int,
    ):
        explicit = read_label_map(label_map) if isinstance(label_map, (str, os.PathLike)) else label_map
        self.files = find_shards(source, split)
        self.index = ShardIndex.build(self.files, explicit)
        self.transform = transform
        self.target_transform = target_transform
        self.draft_size = draft_size
        self.decode = decode
        self._reader = RowGroupReader(self.index, READ_COLUMNS, cache_size=cache_row_groups)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self.files)} shards from {self.files[0].parent}, "
            f"{len(self.index)} images, {len(self.index.rows)} row groups, {len(self.label_names)} classes)"
        )

    @property
    def label_map(self) -> dict[str, Any]:
        """The label map (docs/CONTRACTS.md: num_classes, label_source, classes[label, wnid, name, ...])."""
        return self.index.label_map

    @property
    def label_names(self) -> list[str]:
        """Human-readable class names by label (`label_name` column, HF ClassLabel names)."""
        return [c["name"] for c in sorted(self.label_map["classes"], key=lambda c: c["label"])]

    @property
    def classes(self) -> list[str]:
        """WordNet ids by label (what torchvision's ImageFolder calls `classes`)."""
        return [c.get("wnid", c["name"]) for c in sorted(self.label_map["classes"], key=lambda c: c["label"])]

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def _sample(self, data: bytes, label: int) -> tuple[Any, Any]:
        image: Any = decode_image(data, draft_size=self.draft_size) if self.decode else data
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label


class ParquetImageDataset(_ShardedImages, _MapBase):
    """Map-style dataset: `ds[i] -> (transform(PIL RGB image), label)` in shard order.

    `source`: shard file, shard directory, Parquet root with `split`, or a list of files. `draft_size`: decode
    JPEGs at a reduced scale keeping at least this size (see decode_image). `decode=False` yields raw bytes.
    `label_map`: a dict or a path to label_map.json; default = the one in the shards' schema metadata."""

    def __init__(
        self,
        source: Source,
        split: str | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        draft_size: Size | None = None,
        decode: bool = True,
        label_map: Any = None,
        cache_row_groups: int = 4,
    ):
        super().__init__(source, split, transform, target_transform, draft_size, decode, label_map, cache_row_groups)
        self._indexed = IndexedReader(self.files)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        total = len(self.index)
        index = int(index) + total if int(index) < 0 else int(index)
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} images")
        unit, row = self.index.locate(index)
        hit = self._indexed.read(*self.index.locate_file(unit, index))
        if hit is not None:  # one pread through the footer's byte index
            return self._sample(*hit)
        table = self._reader.read(unit)  # shards without the index: the row group, from the LRU cache
        data = table.column("image")[row]["bytes"].as_py()
        return self._sample(data, table.column("label")[row].as_py())

    @property
    def targets(self) -> np.ndarray:
        """Every row's label (reads only the label column), like ImageFolder.targets."""
        return np.concatenate([pq.read_table(f, columns=["label"]).column(0).to_numpy() for f in self.files])


class ParquetIterableDataset(_ShardedImages, _IterBase):
    """Streaming dataset: row groups in a (seed, epoch)-shuffled order, then a `shuffle_buffer`-row buffer.

    Sharded over distributed ranks (`rank`/`world_size`, default torch.distributed's when initialised) and
    DataLoader workers: every row exactly once per epoch over all ranks with uneven="keep" (see partition.py for
    "drop"/"pad"). The order is a function of (seed, epoch, world_size, num_workers). Call `set_epoch(e)` before
    each epoch (with the default non-persistent workers, so the workers receive the new epoch)."""

    def __init__(
        self,
        source: Source,
        split: str | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        draft_size: Size | None = None,
        decode: bool = True,
        label_map: Any = None,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "keep",
    ):
        super().__init__(source, split, transform, target_transform, draft_size, decode, label_map, 1)
        self.shuffle, self.shuffle_buffer, self.seed, self.epoch = shuffle, shuffle_buffer, seed, 0
        self.rank, self.world_size = _distributed(rank, world_size)
        self.uneven = uneven
        rank_range(len(self.index), self.rank, self.world_size, uneven)  # validate early

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Rows this rank yields per epoch (over all its DataLoader workers)."""
        start, stop = rank_range(len(self.index), self.rank, self.world_size, self.uneven)
        return stop - start

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        worker, workers = _worker()
        rows = self._rows(worker, workers)
        if self.shuffle and self.shuffle_buffer > 1:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
            rows = shuffle_buffer(rows, self.shuffle_buffer, rng)
        for data, label in rows:
            yield self._sample(data, label)

    def _rows(self, worker: int, workers: int) -> Iterator[tuple[bytes, int]]:
        """(bytes, label) of this (rank, worker)'s rows, row group by row group, in epoch order."""
        order = unit_order(len(self.index.rows), self.seed, self.epoch, self.shuffle)
        sizes = self.index.rows[order]
        start, stop = rank_range(int(sizes.sum()), self.rank, self.world_size, self.uneven)
        start, stop = split_range(start, stop, worker, workers)
        for pos, first, end in row_slices(sizes, start, stop):
            table = self._reader.read_uncached(int(order[pos])).slice(first, end - first)
            images = table.column("image").combine_chunks().field("bytes").to_pylist()
            yield from zip(images, table.column("label").to_pylist(), strict=True)


def shuffle_buffer(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    """Yield `items` in a random order using a buffer of `size` items (memory bounded by `size`)."""
    buffer: list[Any] = []
    picks: Iterator[int] = iter(())
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = next(picks, None)
        if j is None:  # random slots drawn in blocks: one numpy call per 4096 items, not per item
            picks = iter(rng.integers(size, size=4096).tolist())
            j = next(picks)
        yield buffer[j]
        buffer[j] = item
    rng.shuffle(buffer)
    yield from buffer


class RowGroupSampler(_SamplerBase):
    """Indices for a ParquetImageDataset: row groups shuffled, then rows shuffled inside windows of `window`
    consecutive row groups (keep `window` <= the dataset's `cache_row_groups`). Distributed like the iterable
    dataset (rank/world_size/uneven); `set_epoch` as torch's DistributedSampler."""

    def __init__(
        self,
        dataset: ParquetImageDataset,
        *,
        shuffle: bool = True,
        window: int = 4,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "keep",
    ):
        self.index, self.shuffle, self.window, self.seed, self.epoch = dataset.index, shuffle, window, seed, 0
        self.rank, self.world_size = _distributed(rank, world_size)
        self.uneven = uneven
        rank_range(len(self.index), self.rank, self.world_size, uneven)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        start, stop = rank_range(len(self.index), self.rank, self.world_size, self.uneven)
        return stop - start

    def __iter__(self) -> Iterator[int]:
        order = unit_order(len(self.index.rows), self.seed, self.epoch, self.shuffle)
        rng = np.random.default_rng([self.seed, self.epoch, 1])
        chunks = []
        for w in range(0, len(order), self.window):
            units = order[w : w + self.window]
            rows = np.concatenate([np.arange(self.index.starts[u], self.index.starts[u + 1]) for u in units])
            if self.shuffle:
                rng.shuffle(rows)
            chunks.append(rows)
        indices = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
        start, stop = rank_range(len(indices), self.rank, self.world_size, self.uneven)
        return iter(np.take(indices, np.arange(start, stop), mode="wrap").tolist())

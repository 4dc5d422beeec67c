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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pyarrow.parquet as pq

from .decode import Size, decode_image
from .format import read_label_map
from .partition import rank_range, row_slices, split_range, unit_order
from .readahead import read_ahead
from .shards import IndexedReader, RowGroupReader, ShardIndex, Source, find_shards

if TYPE_CHECKING:
    from .remote import RemoteShards

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
        source: Source | RemoteShards,
        split: str | None,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[int], Any] | None,
        draft_size: Size | None,
        decode: bool,
        label_map: Any,
        cache_row_groups: int,
    ):
        explicit = read_label_map(label_map) if isinstance(label_map, (str, os.PathLike)) else label_map
        from .remote import RemoteShards

        self.remote: RemoteShards | None = None
        if isinstance(source, RemoteShards):
            self.remote, self.files = source, source.names
            self.index = ShardIndex.build(self.files, explicit, metadata=source.metadata())
        else:
            self.files = find_shards(source, split)
            self.index = ShardIndex.build(self.files, explicit)
        self.transform = transform
        self.target_transform = target_transform
        self.draft_size = draft_size
        self.decode = decode
        self._reader = RowGroupReader(self.index, READ_COLUMNS, cache_size=cache_row_groups, remote=self.remote)

    @classmethod
    def from_dvc(
        cls,
        repo: str | os.PathLike[str],
        path: str,
        rev: str | None = None,
        remote: str | None = None,
        *,
        split: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_gb: float = 20.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        object_timeout: float = 45.0,
        retries: int = 3,
        retry_backoff: float = 0.5,
        **kwargs: Any,
    ) -> Self:
        """The shards of DVC-tracked `path` ("data/parquet/train", or "data/parquet" with `split`) in checkout
        `repo` (at git `rev`), read straight from the DVC remote — no `dvc pull`, no DVC install
        (`pip install 'imagenet-parquet[remote]'`).

        `remote`: a remote name from .dvc/config (default: core.remote) or a URL (s3://, http(s)://, a directory).
        S3 credentials come from the environment as for any boto client; HTTP ones from the remote's DVC options
        (`auth`, `user`, `password`, `custom_auth_header`; secrets in .dvc/config.local) or
        IMAGENET_PARQUET_HTTP_USER / IMAGENET_PARQUET_HTTP_PASSWORD. Row groups are fetched by range requests
        when first read, by the process that reads them, checked against their sha256 column, into a local cache
        of at most `cache_gb` (`cache_dir`, default ~/.cache/imagenet-parquet). Every request: `connect_timeout`,
        `read_timeout` (seconds without a byte), `retries` with exponential backoff from `retry_backoff` seconds,
        all within `object_timeout` seconds per object (the defaults make a stalled server an error within a
        minute). `kwargs` go to the dataset (transform, seed, ...)."""
        from .fetch import Policy
        from .remote import open_dvc

        policy = Policy(connect_timeout, read_timeout, object_timeout, retries, retry_backoff)
        target = f"{path.rstrip('/')}/{split}" if split else path
        return cls(open_dvc(Path(repo), target, rev, remote, cache_dir, cache_gb, policy), **kwargs)

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
        source: Source | RemoteShards,
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
        self._labels: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        total = len(self.index)
        index = int(index) + total if int(index) < 0 else int(index)
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} images")
        unit, row = self.index.locate(index)
        hit: tuple[bytes, int] | None
        if self.remote is not None:  # the row group's bytes fetched into the local cache, the image through the index
            file, file_row = self.index.locate_file(unit, index)
            image = self.remote.read_image(file, int(self.index.group_of[unit]), file_row)
            hit = None if image is None else (image, int(self._remote_labels(unit)[row]))
        else:
            hit = self._indexed.read(*self.index.locate_file(unit, index))
        if hit is not None:  # one pread through the footer's byte index
            return self._sample(*hit)
        table = self._reader.read(unit)  # shards without the index: the row group, from the LRU cache
        data = table.column("image")[row]["bytes"].as_py()
        return self._sample(data, table.column("label")[row].as_py())

    def _remote_labels(self, unit: int) -> np.ndarray:
        """Labels of row group `unit` of remote shards (fetched with the row group, kept: 8 bytes a row)."""
        labels = self._labels.get(unit)
        if labels is None:
            assert self.remote is not None
            file, group = int(self.index.file_of[unit]), int(self.index.group_of[unit])
            labels = self._labels[unit] = self.remote.read_row_group(file, group, ["label"]).column(0).to_numpy()
        return labels

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """A DataLoader batch: the kernel is asked for every image of the batch first (POSIX_FADV_WILLNEED), so
        it reads them in parallel while the first ones decode; then `self[i]` for each, in order."""
        if self.remote is None:
            total = len(self.index)
            wanted = [int(i) + total if int(i) < 0 else int(i) for i in indices]
            rows = [self.index.locate_file(self.index.locate(i)[0], i) for i in wanted if 0 <= i < total]
            self._indexed.willneed(rows)
        return [self[i] for i in indices]

    @property
    def targets(self) -> np.ndarray:
        """Every row's label (reads only the label column), like ImageFolder.targets."""
        if self.remote is not None:
            return np.concatenate(
                [self.remote.read_columns(f, ["label"]).column(0).to_numpy() for f in range(len(self.files))]
            )
        return np.concatenate([pq.read_table(f, columns=["label"]).column(0).to_numpy() for f in self.files])


class ParquetIterableDataset(_ShardedImages, _IterBase):
    """Streaming dataset: row groups in a (seed, epoch)-shuffled order, then a `shuffle_buffer`-row buffer.

    Sharded over distributed ranks (`rank`/`world_size`, default torch.distributed's when initialised) and
    DataLoader workers: every row exactly once per epoch over all ranks with uneven="keep" (see partition.py for
    "drop"/"pad"). The order is a function of (seed, epoch, world_size, num_workers). Call `set_epoch(e)` before
    each epoch (with the default non-persistent workers, so the workers receive the new epoch).

    `read_ahead`: row groups each worker reads ahead of decoding, in a background thread (0: read when needed);
    the kernel is also asked (POSIX_FADV_WILLNEED) for the two after those. Memory: read_ahead + 2 row groups."""

    def __init__(
        self,
        source: Source | RemoteShards,
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
        read_ahead: int = 2,
    ):
        super().__init__(source, split, transform, target_transform, draft_size, decode, label_map, 1)
        if read_ahead < 0:
            raise ValueError(f"read_ahead: expected >= 0 row groups, found {read_ahead}")
        self.read_ahead = read_ahead
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
        slices = [(int(order[pos]), first, end) for pos, first, end in row_slices(sizes, start, stop)]
        hint = lambda ahead: self._reader.willneed([unit for unit, _, _ in ahead])  # noqa: E731
        for rows in read_ahead(slices, self._load, self.read_ahead, hint, hint_ahead=self.read_ahead + 2):
            yield from rows

    def _load(self, piece: tuple[int, int, int]) -> list[tuple[bytes, int]]:
        """Rows [first, end) of row group `unit` as (bytes, label): what the read-ahead thread prepares."""
        unit, first, end = piece
        table = self._reader.read_uncached(unit).slice(first, end - first)
        images = [data for chunk in table.column("image").chunks for data in chunk.field("bytes").to_pylist()]
        return list(zip(images, table.column("label").to_pylist(), strict=True))


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

"""PyTorch-style datasets over the Parquet shards (torch optional: without it they are plain Python classes).

* `ParquetImageDataset`: map-style, `ds[i] -> (image, label)`; reads the image with one `pread` through the
  shard footer's per-row byte index (labels read once per file); for shards without that index it reads the row
  group holding `i` (image bytes and label columns) and keeps the most recent `cache_row_groups` per process.
* `ParquetIterableDataset`: streams the epoch's global order (partition.py: a function of seed and epoch),
  interleaved over distributed ranks and handed to DataLoader workers in chunks of `batch_size`, so global step
  t holds the same images on any number of GPUs and workers; images are read one `pread` each (the byte index),
  a few chunks ahead in a background thread; `state_dict()` / `load_state_dict()` resume mid-epoch.
* `RowGroupSampler` (samplers.py): the same order as indices for the map-style dataset.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pyarrow.parquet as pq

from .decode import Size, decode_image
from .format import class_ids, read_label_map
from .overlay import Overlay, kept_order, resolve_overlay
from .partition import Position, epoch_order, rank_positions, worker_positions
from .readahead import read_ahead
from .resume import Resumable
from .shards import IndexedReader, RowGroupReader, ShardIndex, Source, checked_label, find_shards

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
        overlay: Any = "auto",
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
        self.overlay = self._overlay(overlay, split)
        self._kept = None if self.overlay is None else self.overlay.kept
        self._reader = RowGroupReader(self.index, READ_COLUMNS, cache_size=cache_row_groups, remote=self.remote)
        self._indexed = IndexedReader(self.files, num_classes=len(self.label_names), labels=self.overlay is None)
        self._labels: dict[int, np.ndarray] = {}

    def _overlay(self, overlay: Any, split: str | None) -> Overlay | None:
        """The curation overlay (overlay.py): found beside the shards (or fetched with a remote version) by default."""
        rows = np.bincount(self.index.file_of, weights=self.index.rows, minlength=len(self.files)).astype(np.int64)
        if self.remote is not None:
            first = self.remote.footer(0).metadata
            found, footers = self.remote.overlay_file(), self.remote.footer_digests()
            return resolve_overlay(
                overlay, self.files, split, rows.tolist(), len(self.label_names), first, found, footers
            )
        first = pq.read_metadata(self.files[0]).metadata
        return resolve_overlay(overlay, self.files, split, rows.tolist(), len(self.label_names), first)

    @property
    def num_images(self) -> int:
        """The images this dataset yields: the shards' rows, less those the curation overlay excludes."""
        return len(self.index) if self._kept is None else len(self._kept)

    def _global(self, index: int) -> int:
        """Dataset index -> the global row of the shards (the same without an overlay)."""
        return index if self._kept is None else int(self._kept[index])

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
            f"{self.num_images} images, {len(self.index.rows)} row groups, {len(self.label_names)} classes"
            f"{', curation overlay applied' if self.overlay is not None else ''})"
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
        """The class folder names by label, as torchvision's ImageFolder gives `classes`: the WordNet ids of an
        ImageNet-style dataset, the folder names of any other (docs/CONTRACTS.md)."""
        return class_ids(self.label_map)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def _read_row(self, index: int) -> tuple[bytes, int]:
        """(image bytes, label) of global row `index`: one pread through the footer's byte index (local shards),
        the row group fetched into the local cache (remote), or the cached row group (shards without the index)."""
        unit, row = self.index.locate(index)
        hit: tuple[bytes, int] | None
        if self.remote is not None:
            file, file_row = self.index.locate_file(unit, index)
            image = self.remote.read_image(file, int(self.index.group_of[unit]), file_row)
            label = -1 if image is None or self.overlay is not None else self._remote_labels(unit)[row]
            hit = None if image is None else (image, label)
        else:
            hit = self._indexed.read(*self.index.locate_file(unit, index))
        if hit is None:
            table = self._reader.read(unit)
            hit = table.column("image")[row]["bytes"].as_py(), table.column("label")[row].as_py()
        if self.overlay is not None:
            return hit[0], int(self.overlay.labels[index])
        return hit[0], checked_label(hit[1], len(self.label_names), self.files[self.index.locate_file(unit, index)[0]])

    def _remote_labels(self, unit: int) -> np.ndarray:
        """Labels of row group `unit` of remote shards (fetched with the row group, kept: 8 bytes a row)."""
        labels = self._labels.get(unit)
        if labels is None:
            assert self.remote is not None
            file, group = int(self.index.file_of[unit]), int(self.index.group_of[unit])
            labels = self._labels[unit] = self.remote.read_row_group(file, group, ["label"]).column(0).to_numpy()
        return labels

    def _willneed(self, indices: list[int]) -> None:
        """Ask the kernel for these rows' images (POSIX_FADV_WILLNEED; local shards with the byte index)."""
        if self.remote is None:
            self._indexed.willneed([self.index.locate_file(self.index.locate(i)[0], i) for i in indices])

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
    `label_map`: a dict or a path to label_map.json; default = the one in the shards' schema metadata.
    `overlay`: the curation overlay (labels and exclusions, docs/CONTRACTS.md): "auto" (default) finds it beside
    the shards (`<root>/../overlay/<split>.parquet`; a remote version's is fetched and checked) and refuses shards
    that need one when there is none; a path; or False to read the labels as converted. `len(ds)`, `ds[i]`,
    `targets` and `classes` are then those of the curated dataset: excluded images are skipped."""

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
        overlay: Any = "auto",
    ):
        super().__init__(
            source, split, transform, target_transform, draft_size, decode, label_map, cache_row_groups, overlay
        )

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        total = self.num_images
        index = int(index) + total if int(index) < 0 else int(index)
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} images")
        return self._sample(*self._read_row(self._global(index)))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """A DataLoader batch: the kernel is asked for every image of the batch first (POSIX_FADV_WILLNEED), so
        it reads them in parallel while the first ones decode; then `self[i]` for each, in order."""
        total = self.num_images
        wanted = [int(i) + total if int(i) < 0 else int(i) for i in indices]
        self._willneed([self._global(i) for i in wanted if 0 <= i < total])
        return [self[i] for i in indices]

    @property
    def targets(self) -> np.ndarray:
        """Every image's label (the overlay's, else the label column), like ImageFolder.targets."""
        if self.overlay is not None:
            labels: np.ndarray = self.overlay.labels[self.overlay.keep]
            return labels
        if self.remote is not None:
            return np.concatenate(
                [self.remote.read_columns(f, ["label"]).column(0).to_numpy() for f in range(len(self.files))]
            )
        return np.concatenate([pq.read_table(f, columns=["label"]).column(0).to_numpy() for f in self.files])


class ParquetIterableDataset(_ShardedImages, Resumable, _IterBase):
    """Streaming dataset: the epoch's global order (a function of seed and epoch: row groups shuffled, rows
    shuffled inside windows of `window` row groups), interleaved over distributed ranks (`rank`/`world_size`,
    default torch.distributed's when initialised) and handed to DataLoader workers in chunks of `batch_size`.

    Pass the DataLoader's `batch_size`: then global step t (one batch on every rank) holds the same images
    whatever `world_size` and `num_workers` are, and `state_dict()` / `load_state_dict()` (torchdata's
    StatefulDataLoader calls them in each worker) resume mid-epoch: on the same topology exactly where the run
    stopped; on another, from `{"epoch": e, "samples_seen": n}` (n: the images of the global steps the loop
    finished) with every remaining image exactly once. Without `batch_size` a rank's positions go to workers one
    by one: every image still once per epoch, but which images share a batch depends on `num_workers`.
    `uneven`: partition.py ("keep": every image once). Call `set_epoch(e)` before each epoch (with the default
    non-persistent workers, so the workers receive the new epoch).

    `shuffle_buffer` (rows) is the older way to size the window: rounded to whole row groups. `read_ahead`:
    pieces of up to 64 images each worker reads ahead of decoding, in a background thread; the kernel is also
    asked (POSIX_FADV_WILLNEED) for the two after those."""

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
        window: int = 4,
        shuffle_buffer: int | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "keep",
        read_ahead: int = 2,
        overlay: Any = "auto",
    ):
        super().__init__(source, split, transform, target_transform, draft_size, decode, label_map, 1, overlay)
        if read_ahead < 0:
            raise ValueError(f"read_ahead: expected >= 0 pieces, found {read_ahead}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1 (the DataLoader's), found {batch_size}")
        if shuffle_buffer is not None:
            window = max(1, round(shuffle_buffer * len(self.index.rows) / max(1, len(self.index))))
        self.overlay_digest = None if self.overlay is None else self.overlay.digest
        self.read_ahead, self.batch_size = read_ahead, batch_size
        self._init_order(shuffle, window, seed, rank, world_size, uneven)
        self._reader.cache_size = max(1, window)  # shards without the byte index: a window's row groups

    def _topology(self) -> tuple[int, int, int]:
        return self.world_size, _worker()[1], self.batch_size or 1

    def _total(self) -> int:
        return self.num_images

    def _other_topology(self, position: Position) -> Position:
        """Per-worker states (StatefulDataLoader with workers) are not global: refuse them on another topology."""
        assert position.topology is not None
        if position.topology[1] > 1:
            raise ValueError(
                f"state: saved by one of {position.topology[1]} DataLoader workers of a run with (world_size, "
                f"num_workers, batch_size) = {tuple(position.topology)}, found {self._topology()} now; on "
                'another topology load {"epoch": e, "samples_seen": n} instead (n: images of the global steps '
                "your loop finished), or resume on the same topology"
            )
        return super()._other_topology(position)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for data, label in self._rows():
            yield self._sample(data, label)

    def _rows(self) -> Iterator[tuple[bytes, int]]:
        """(bytes, label) of this (rank, worker)'s positions of the epoch order, in order, read ahead."""
        worker, workers = _worker()
        start, local, count = self._begin()
        order = epoch_order(self.index.starts, self.seed, self.epoch, self.shuffle, self.window)
        order = kept_order(order, self.overlay)
        positions = rank_positions(self._total(), start.origin, self.rank, self.world_size, self.uneven)
        mine = worker_positions(count, self.batch_size or 1, worker, workers, local)
        rows = order[positions[mine]].tolist()  # the global rows this worker yields, in order
        pieces = [(k, min(k + 64, len(rows))) for k in range(0, len(rows), 64)]  # 64 of them at a time

        def hint(ahead: Sequence[tuple[int, int]]) -> None:
            self._willneed([i for a, b in ahead for i in rows[a:b]])

        def load(piece: tuple[int, int]) -> list[tuple[bytes, int]]:
            return [self._read_row(i) for i in rows[piece[0] : piece[1]]]

        loads = read_ahead(pieces, load, self.read_ahead, hint, self.read_ahead + 2)
        for (a, b), loaded in zip(pieces, loads, strict=True):
            for done, row in zip(mine[a:b].tolist(), loaded, strict=True):
                self._advance(done + 1)  # before the yield: a snapshot taken after it counts this row
                yield row
        self._resume = None  # this pass is done: a next pass over the epoch starts at its beginning

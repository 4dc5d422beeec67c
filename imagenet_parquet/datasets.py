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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import ShardedImages, _worker
from .cache import EvictionPlan
from .decode import Size
from .partition import Position, rank_positions, worker_positions
from .predownload import Predownload
from .readahead import read_ahead
from .resume import Resumable
from .shards import Source

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


PRESSURE = 0.8  # the share of cache_limit the node's live row groups may take before rows are fetched alone


@dataclass
class NodeReads:
    """A worker's part in its node's cache (remote shards): the node's eviction plan, the node read each of the
    worker's positions is (`cursor`), the row group of each of its rows, and its predownload thread."""

    plan: EvictionPlan | None = None
    cursor: np.ndarray | None = None
    units: np.ndarray | None = None
    ahead: Predownload | None = None

    def reading(self, i: int) -> None:
        """The worker is about to read its `i`-th row."""
        if self.plan is not None and self.cursor is not None and i < len(self.cursor):
            self.plan.cursor = int(self.cursor[i])
        if self.ahead is not None and self.units is not None and i < len(self.units):
            self.ahead.reading(int(self.units[i]))

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()


class ParquetImageDataset(ShardedImages, _MapBase):
    """Map-style dataset: `ds[i] -> (transform(PIL RGB image), label)` in shard order.

    `source`: shard file, shard directory, Parquet root with `split`, or a list of files. `draft_size`: decode
    JPEGs at a reduced scale keeping at least this size (see decode_image). `decode=False` yields raw bytes.
    `crop`: the training or evaluation crop decoded straight from the bytes, decoding only the scale it needs
    (`TrainCrop(224)`, `EvalCrop(224, resize=256)`: crops.py; a uint8 (3, H, W) tensor, then `transform`).
    `label_map`: a dict or a path to label_map.json; default = the one in the shards' schema metadata.
    `overlay`: the curation overlay (labels and exclusions, docs/CONTRACTS.md): "auto" (default) finds it beside
    the shards (`<root>/../overlay/<split>.parquet`; a remote version's is fetched and checked) and refuses shards
    that need one when there is none; a path; or False to read the labels as converted. `len(ds)`, `ds[i]`,
    `targets` and `classes` are then those of the curated dataset: excluded images are skipped. `verify=True`
    checks every image read from local shards against its row's sha256 (remote reads always are); footers are
    checked against the overlay, labels against the label map, whatever `verify` is (docs/trainer.md).
    `view`: a named subset (`<root>/../views/<view>/<split>.parquet`, the views stage's; it replaces the overlay,
    which it already applies): its rows only, labels 0..K-1 in its classes' order, `classes` / `label_names` its
    classes; a view that is not there is refused, listing those that are."""

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
        verify: bool = False,
        crop: Callable[[bytes], Any] | None = None,
        view: str | None = None,
    ):
        super().__init__(
            source,
            split,
            transform,
            target_transform,
            draft_size,
            decode,
            label_map,
            cache_row_groups,
            overlay,
            verify,
            crop,
            view,
        )

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        total = self.num_images
        index = int(index) + total if int(index) < 0 else int(index)
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} images")
        row = self._global(index)
        return self._sample(*self._read_row(row), row)

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
        return np.concatenate(
            [self.index.read_columns(f, ["label"]).column(0).to_numpy() for f in range(len(self.files))]
        )


class ParquetIterableDataset(ShardedImages, Resumable, _IterBase):
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

    `crop`: as for ParquetImageDataset (`TrainCrop(224)`: RandomResizedCrop + flip, decoding only the scale the
    crop needs; crops.py). `shuffle_buffer` (rows) is the older way to size the window: rounded to whole row
    groups. `read_ahead`: pieces of up to 64 images each worker reads ahead of decoding, in a background thread;
    the kernel is also asked (POSIX_FADV_WILLNEED) for the two after those. `view`: as for ParquetImageDataset;
    a resume state records it (and the overlay's or view's content digest): a state of another view or another
    version of the dataset is refused."""

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
        verify: bool = False,
        crop: Callable[[bytes], Any] | None = None,
        view: str | None = None,
        canonical_nodes: int | str | None = "auto",
        ranks_per_node: int | None = None,
        predownload: int = 0,
    ):
        super().__init__(
            source, split, transform, target_transform, draft_size, decode, label_map, 1, overlay, verify, crop, view
        )
        if read_ahead < 0:
            raise ValueError(f"read_ahead: expected >= 0 pieces, found {read_ahead}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1 (the DataLoader's), found {batch_size}")
        if shuffle_buffer is not None:
            window = max(1, round(shuffle_buffer * len(self.index.rows) / max(1, len(self.index))))
        self.overlay_digest = None if self.overlay is None else self.overlay.digest
        self.read_ahead, self.batch_size = read_ahead, batch_size
        if predownload < 0:
            raise ValueError(f"predownload: expected >= 0 row groups, found {predownload}")
        self.predownload = predownload
        self._init_order(shuffle, window, seed, rank, world_size, uneven, canonical_nodes, ranks_per_node)
        self._reader.cache_size = max(1, window)  # shards without the byte index: a window's row groups

    def _topology(self) -> tuple[int, int, int, int]:
        return self.world_size, _worker()[1], self.batch_size or 1, self.nodes

    def _total(self) -> int:
        return self.num_images

    def _other_topology(self, position: Position) -> Position:
        """Per-worker states (StatefulDataLoader with workers) are not global: refuse them on another topology."""
        assert position.topology is not None
        if position.topology[1] > 1:
            raise ValueError(
                f"state: saved by one of {position.topology[1]} DataLoader workers of a run with (world_size, "
                f"num_workers, batch_size, nodes) = {tuple(position.topology)}, found {self._topology()} now; on "
                'another topology load {"epoch": e, "samples_seen": n} instead (n: images of the global steps '
                "your loop finished), or resume on the same topology"
            )
        return super()._other_topology(position)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for data, label, row in self._rows():
            yield self._sample(data, label, row)

    def _rows(self) -> Iterator[tuple[bytes, int, int]]:
        """(bytes, label, global row) of this (rank, worker)'s positions of the epoch order, in order, read ahead."""
        worker, workers = _worker()
        start, local, count = self._begin()
        order, positions = self._order(), self._positions(start.origin)
        mine = worker_positions(count, self.batch_size or 1, worker, workers, local)
        rows = order[positions[mine]].tolist()  # the global rows this worker yields, in order
        pieces = [(k, min(k + 64, len(rows))) for k in range(0, len(rows), 64)]  # 64 of them at a time
        node = self._node_reads(order, start.origin, positions[mine], rows)

        def hint(ahead: Sequence[tuple[int, int]]) -> None:
            self._willneed([i for a, b in ahead for i in rows[a:b]])

        def load(piece: tuple[int, int]) -> list[tuple[bytes, int]]:
            node.reading(piece[0])
            return [self._read_row(i) for i in rows[piece[0] : piece[1]]]

        loads = read_ahead(pieces, load, self.read_ahead, hint, self.read_ahead + 2)
        try:
            for (a, b), loaded in zip(pieces, loads, strict=True):
                for done, (data, label), row in zip(mine[a:b].tolist(), loaded, rows[a:b], strict=True):
                    self._advance(done + 1)  # before the yield: a snapshot taken after it counts this row
                    yield data, label, row
        finally:
            node.close()
        self._resume = None  # this pass is done: a next pass over the epoch starts at its beginning

    def _node_reads(self, order: np.ndarray, origin: int, positions: np.ndarray, rows: list[int]) -> NodeReads:
        """What this worker tells the node cache (remote shards): where its node reads each row group this epoch
        (the eviction plan), and which row groups to fetch ahead (`predownload`)."""
        if self.remote is None:
            return NodeReads()
        per = self.world_size // self.nodes
        node = self.rank // per
        ranks = range(node * per, (node + 1) * per)
        total, world, uneven = self._total(), self.world_size, self.uneven
        reads = np.sort(
            np.concatenate([rank_positions(total, origin, self._slot_of(r, origin), world, uneven) for r in ranks])
        )
        units = np.searchsorted(self.index.starts, order[reads], side="right") - 1
        if self.canonical_nodes is not None and self.nodes > 1:
            self._share_rows(order[reads])
        file_units = np.searchsorted(self.index.file_of, np.arange(len(self.files)))
        md5s = [md5 for _, md5 in self.remote.entries]
        plan = EvictionPlan.of_reads(md5s, file_units, units, len(self.index.rows))
        self.remote.cache.plan = plan
        sizes = self.index.spans[:, 1] - self.index.spans[:, 0]
        self._pressure = plan.peak(sizes) > PRESSURE * self.remote.cache_bytes
        mine = np.searchsorted(self.index.starts, np.asarray(rows, dtype=np.int64), side="right") - 1
        fetch_ahead = self.predownload and not self._pressure
        ahead = Predownload(mine.tolist(), self._prefetch, self.predownload) if fetch_ahead else None
        return NodeReads(plan, np.searchsorted(reads, positions), mine, ahead)

"""Index order for the map-style dataset: `RowGroupSampler` (the epoch's global order, elastic and resumable), and
`shuffle_buffer`, a bounded-memory shuffle of any iterator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .resume import Resumable

if TYPE_CHECKING:
    from torch.utils.data import Sampler

    from .datasets import ParquetImageDataset

    _SamplerBase = Sampler[int]
else:
    try:
        from torch.utils.data import Sampler as _SamplerBase
    except ImportError:  # pragma: no cover - exercised by the no-torch import test in a subprocess
        _SamplerBase = object


class RowGroupSampler(Resumable, _SamplerBase):
    """Indices for a ParquetImageDataset in the epoch's global order (partition.py: row groups shuffled, rows
    shuffled inside windows of `window` row groups; a function of seed and epoch only), interleaved over ranks.

    Global step t — batch t of every rank, for any per-rank batch size B — holds positions [t·G, (t+1)·G) of
    that order, G = B·world_size: the same images on any number of GPUs (and DataLoader workers, which only
    decode). `state_dict()` / `load_state_dict()` resume mid-epoch (torchdata's StatefulDataLoader calls them);
    a state saved on one world size resumes on another with every remaining image exactly once. Distributed by
    `rank`/`world_size` (default torch.distributed's when initialised), `uneven` as in partition.py; call
    `set_epoch` before each epoch as for torch's DistributedSampler. It orders the dataset's rows: those of its
    `view` (`view=`, when given, must name that one; a state of another view is refused)."""

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
        view: str | None = None,
        canonical_nodes: int | str | None = "auto",
        ranks_per_node: int | None = None,
    ):
        if view is not None and view != dataset.view:
            raise ValueError(
                f"view: expected the dataset's view ({dataset.view!r}: the sampler orders its rows), found {view!r}; "
                "pass view= to the dataset"
            )
        self.view = dataset.view
        self.index, self.overlay = dataset.index, dataset.overlay
        self.overlay_digest = None if dataset.overlay is None else dataset.overlay.digest
        # global row -> dataset index (the overlay's kept rows are the dataset's indices 0..n-1)
        self._position = None if dataset.overlay is None else np.cumsum(dataset.overlay.keep) - 1
        self._count = dataset.num_images
        self._init_order(shuffle, window, seed, rank, world_size, uneven, canonical_nodes, ranks_per_node)

    def _topology(self) -> tuple[int, int, int, int]:
        return self.world_size, 1, 1, self.nodes

    def _total(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        start, local, _ = self._begin()
        order = self._order()
        if self._position is not None:
            order = self._position[order]
        positions = self._positions(start.origin)
        return self._yield(order[positions[local:]].tolist(), local)

    def _yield(self, indices: list[int], local: int) -> Iterator[int]:
        for n, index in enumerate(indices, start=local + 1):
            self._advance(n)  # before the yield: a state taken once the batch is formed counts it
            yield index
        self._resume = None  # the epoch is done: a next pass over it starts at its beginning


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

"""Mid-epoch resume for the sampler and the iterable dataset: `set_epoch`, `state_dict()`, `load_state_dict()`.

Both follow torchdata's `Stateful` protocol, so `StatefulDataLoader` saves and restores them (the sampler in the
main process, the iterable dataset in each worker). The state is the epoch's `Position` (partition.py): a global
count of positions consumed, so a resume on the same topology continues exactly where the run stopped, and a
state built by the training loop — `{"epoch": e, "samples_seen": n}`, n = the images of the global steps it
finished — resumes on any world size, worker count or batch size with every remaining image exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .overlay import Overlay, kept_order
from .partition import (
    DEFAULT_CANONICAL_NODES,
    Position,
    check_canonical,
    check_nodes,
    check_window,
    epoch_order,
    node_slot,
    partitioned_order,
    rank_count,
    rank_positions,
)
from .shards import ShardIndex

AUTO = "auto"


def distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
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


def node_count(rank: int, world_size: int, ranks_per_node: int | None) -> int:
    """The nodes the ranks run on: world_size / `ranks_per_node`, by default torchrun's LOCAL_WORLD_SIZE when its
    WORLD_SIZE is this world size (else one node). Ranks must be numbered node by node (torchrun's LOCAL_RANK =
    rank mod ranks per node), which is checked where torchrun's variables say so."""
    env = os.environ
    launched = env.get("WORLD_SIZE") == str(world_size) and env.get("RANK") == str(rank)
    if ranks_per_node is None:
        local = env.get("LOCAL_WORLD_SIZE", "")
        ranks_per_node = int(local) if launched and local.isdigit() and int(local) > 0 else world_size
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(
            f"ranks_per_node: expected a divisor of world_size={world_size} (every node runs the same number of "
            f"ranks), found {ranks_per_node}"
        )
    local_rank = env.get("LOCAL_RANK", "")
    if launched and local_rank.isdigit() and int(local_rank) != rank % ranks_per_node:
        raise ValueError(
            f"rank {rank}: expected ranks numbered node by node (LOCAL_RANK = rank mod {ranks_per_node} ranks per "
            f"node, as torchrun numbers them), found LOCAL_RANK={local_rank}; launch with torchrun, or pass "
            "ranks_per_node=world_size to read without a node-aware order"
        )
    return world_size // ranks_per_node


class Resumable:
    """The epoch order's settings and state, shared by RowGroupSampler and ParquetIterableDataset."""

    index: ShardIndex
    overlay: Overlay | None = None  # the curation overlay or view: the order holds its kept rows only
    overlay_digest: str | None = None  # the curation overlay's content digest: a state records it, a resume checks it
    view: str | None = None  # the view read (a state records it, a resume checks it)

    def _init_order(
        self,
        shuffle: bool,
        window: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        uneven: str,
        canonical_nodes: int | str | None = AUTO,
        ranks_per_node: int | None = None,
    ) -> None:
        check_window(window)
        self.shuffle, self.window, self.seed, self.epoch = shuffle, window, seed, 0
        self.rank, self.world_size = distributed(rank, world_size)
        self.nodes = node_count(self.rank, self.world_size, ranks_per_node)
        self._auto = canonical_nodes == AUTO  # a resume state may then set it (the run it continues chose it)
        if self._auto:
            canonical_nodes = None if self.nodes == 1 else DEFAULT_CANONICAL_NODES
        elif canonical_nodes is not None:
            check_canonical(canonical_nodes)
        self.canonical_nodes: int | None = canonical_nodes  # type: ignore[assignment]
        check_nodes(self.world_size, self.nodes, self.canonical_nodes)
        self.uneven = uneven
        self._resume: Position | None = None
        self._pass: tuple[Position, int, int] | None = None  # (this pass's start, rank positions consumed, count)
        rank_count(self._total(), 0, self._slot(0), self.world_size, uneven)  # validate early

    def __len__(self) -> int:
        """Rows this rank yields per epoch (over all its DataLoader workers)."""
        return rank_count(self._total(), 0, self._slot(0), self.world_size, self.uneven)

    def _total(self) -> int:
        """The images of an epoch (the shards' rows, less those a curation overlay excludes)."""
        return len(self.index)

    def _topology(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def _slot(self, origin: int) -> int:
        return self._slot_of(self.rank, origin)

    def _slot_of(self, rank: int, origin: int) -> int:
        """The slot of `rank` among the world_size positions of each block (partition.node_slot: its node's rows,
        with the node-aware order; else the rank)."""
        if self.canonical_nodes is None:
            return rank
        return node_slot(rank, self.world_size, self.nodes, origin)

    def _order(self) -> np.ndarray:
        """This epoch's order of the rows read (global rows; the kept ones only), identical in every process."""
        index, keep = self.index, None if self.overlay is None else self.overlay.keep
        if self.canonical_nodes is None:
            order = epoch_order(index.starts, self.seed, self.epoch, self.shuffle, self.window, index.generations)
            return kept_order(order, self.overlay)
        return partitioned_order(
            index.starts,
            self.seed,
            self.epoch,
            self.canonical_nodes,
            self.shuffle,
            self.window,
            index.generations,
            keep,
        )

    def _positions(self, origin: int) -> np.ndarray:
        """The positions of the epoch order this rank yields from `origin` (partition.rank_positions)."""
        return rank_positions(self._total(), origin, self._slot(origin), self.world_size, self.uneven)

    def set_epoch(self, epoch: int) -> None:
        """Call before each epoch, as for torch's DistributedSampler (a loaded state of another epoch is dropped)."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: {version, seed, num_samples, epoch, samples_seen, origin, topology} (and the
        canonical_nodes of a node-aware order, the curation digest and the view when there are)."""
        if self._pass is not None and self._pass[0].epoch == self.epoch:
            start, local, count = self._pass
            seen = self._total() if local >= count else min(self._total(), start.origin + local * self.world_size)
            origin = start.origin
        else:
            start = self._start()
            origin, seen = start.origin, start.seen
        state = Position(self.epoch, origin, seen, self._topology()).to_state(self.seed, self._total())
        if self.canonical_nodes is not None:
            state["canonical_nodes"] = self.canonical_nodes
        state = {**state, "curation": self.overlay_digest} if self.overlay_digest else state
        return {**state, "view": self.view} if self.view else state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at `state` (from state_dict(), or `{"epoch": e, "samples_seen": n}` from the training loop):
        the next pass over epoch `state["epoch"]` yields only what that run had not consumed."""
        position = Position.from_state(state, self.seed, self._total())
        self._check_curation(state)
        self._check_canonical(state)
        if position.topology is not None and position.topology != self._topology():
            position = self._other_topology(position)
        self.epoch, self._resume, self._pass = position.epoch, position, None

    def _check_canonical(self, state: Mapping[str, Any]) -> None:
        """The state's order must be this one: its canonical_nodes (absent: the order that is not node-aware) that
        of this dataset — adopted when this dataset was left to choose it (the default, "auto")."""
        saved = state.get("canonical_nodes")
        if "canonical_nodes" in state and saved is not None:
            check_canonical(saved)
        elif "topology" not in state and "canonical_nodes" not in state:
            return  # {"epoch", "samples_seen"} alone: the training loop's count, in this dataset's order
        if saved == self.canonical_nodes:
            return
        if not self._auto:
            raise ValueError(
                f"state['canonical_nodes']: expected canonical_nodes={self.canonical_nodes} (this dataset's epoch "
                f"order), found {saved!r}; a state's positions are of its own order: pass canonical_nodes={saved!r} "
                'to resume it, or start the epoch again ({"epoch": e, "samples_seen": 0})'
            )
        check_nodes(self.world_size, self.nodes, saved)
        self.canonical_nodes = saved

    def _check_curation(self, state: Mapping[str, Any]) -> None:
        """A state saved under another curation overlay (other labels or exclusions, another version of the
        dataset: appended or removed images) or on another view is refused."""
        if ("view" in state or "curation" in state) and state.get("view") != self.view:
            raise ValueError(
                f"state: expected view={self.view!r} (the view this dataset reads), found view={state.get('view')!r}"
                "; a state saved on another view cannot resume here (its positions are of other rows): start the "
                'epoch again, or load {"epoch": e, "samples_seen": 0}'
            )
        if "curation" in state and state["curation"] != self.overlay_digest:
            found = str(state["curation"])[:16] if isinstance(state["curation"], str) else repr(state["curation"])
            raise ValueError(
                f"state: expected curation={str(self.overlay_digest)[:16] if self.overlay_digest else 'none'}… (the "
                f"overlay or view this dataset applies), found curation={found}…; the labels or exclusions changed "
                "(or the shards: another version of the dataset) since the state was saved: start the epoch again, or "
                'load {"epoch": e, "samples_seen": 0}'
            )

    def _other_topology(self, position: Position) -> Position:
        """A state saved on another topology: its `samples_seen` is global, so the rest of the epoch starts there."""
        return Position(position.epoch, position.seen, position.seen)

    def _start(self) -> Position:
        """Where the next pass over this epoch starts: the loaded state when it is this epoch's, else 0."""
        if self._resume is not None and self._resume.epoch == self.epoch:
            return self._resume
        return Position(self.epoch, 0, 0)

    def _begin(self) -> tuple[Position, int, int]:
        """Start a pass: (its start, this rank's positions already consumed since the origin, the rank's count)."""
        start = self._start()
        count = rank_count(self._total(), start.origin, self._slot(start.origin), self.world_size, self.uneven)
        local = count if start.seen >= self._total() else min(count, start.local_done(self.world_size))
        self._pass = (start, local, count)
        return start, local, count

    def _advance(self, local: int) -> None:
        """This rank's positions up to `local` (since the origin) are consumed."""
        assert self._pass is not None
        self._pass = (self._pass[0], local, self._pass[2])

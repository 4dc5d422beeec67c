"""Pure order arithmetic for both readers: the epoch's global order, which positions of it a rank and a DataLoader
worker yield, and the resumable position (`Position`) that `state_dict()` / `load_state_dict()` carry.

One epoch = every row once, in an order that is a function of (seed, epoch) only (`epoch_order`): row groups
shuffled, then rows shuffled inside windows of `window` consecutive row groups (a window's images lie in a few
row groups: the reads stay local; shards written in hashed order make every row group a uniform class mix).

Ranks interleave (`rank_positions`): rank r of W yields positions origin + m·W + r, m = 0, 1, ... So a global
batch of G = B·W images — rank r's batch t holds its positions [t·B, (t+1)·B) — is positions
[origin + t·G, origin + (t+1)·G) of the epoch order whatever W (dividing G) is: global step t holds the same G
images on 1, 2 or 8 GPUs. DataLoader workers take a rank's positions in chunks of `chunk` (`worker_positions`,
round-robin, as the DataLoader takes batches from its workers in turn): with chunk = the loader's batch size the
rank's batches come out in position order, whatever the number of workers.

`uneven` says what happens when the positions left (total - origin) are not a multiple of world_size:
  * "keep": every row exactly once; ranks yield floor or ceil of (total - origin) / W (batch counts may differ
    by one).
  * "drop": every rank yields floor((total - origin) / W); the last few positions of this epoch are skipped.
  * "pad":  every rank yields ceil((total - origin) / W); positions past the end wrap to the epoch's first ones
    (as torch's DistributedSampler does).

Node-aware order (`canonical_nodes=C`, `partitioned_order`): the kept rows, their row groups in an order fixed for
the run (a function of the seed), are cut into C canonical partitions of equal size (±1 row); each epoch orders each
partition as above (its row groups shuffled, rows shuffled inside windows) and position k of the epoch is row k // C
of partition k mod C. So the order is the same for any number of nodes N dividing C, and position k belongs to
node k mod N: `node_slot` gives the ranks of node n (ranks numbered node by node, as torchrun does) the slots
≡ n (mod N) of each block of W positions, so a node reads only its C / N partitions — the same row groups every
epoch (a node cache holds them), about 1/N of the bytes — while global step t still holds positions
[origin + t·G, origin + (t+1)·G), the same images on 1, 2, 4 or 8 nodes.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

UNEVEN = ("keep", "drop", "pad")
STATE_VERSION = 1
MAX_INT = 2**63 - 1
MAX_TOPOLOGY = 2**31 - 1  # world_size, DataLoader workers, batch size, nodes
DEFAULT_CANONICAL_NODES = 64  # canonical partitions of a run on several nodes when none is given (docs/trainer.md)
MAX_CANONICAL_NODES = 1 << 16
STATE_HELP = (
    "load a state saved by state_dict() of the same dataset/sampler (same shards, same seed), or "
    '{"epoch": e, "samples_seen": n} built by the training loop (n: images of the global steps it finished)'
)


def unit_order(num_units: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of row groups for an epoch; identical in every rank and worker."""
    if not shuffle:
        return np.arange(num_units, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_units).astype(np.int64)


def epoch_order(
    starts: np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window: int = 4,
    generations: np.ndarray | None = None,
) -> np.ndarray:
    """Every row index once (row group u holds rows starts[u]..starts[u+1]-1): row groups in `unit_order`, rows
    shuffled inside each window of `window` consecutive row groups of that order. A function of (seed, epoch).

    `generations[u]`: the generation of row group u (shards appended later: format.shard_generation). With one
    generation, the order above. With several, each generation's row groups are ordered so among themselves
    (generation 0 exactly as alone) and the generations are merged by a seeded random interleave of positions
    (`interleave`): each position holds generation g with probability rows_g / total, so the rows of an appended
    generation — one new class, say — spread over the epoch instead of filling the batches of a window."""
    check_window(window)
    starts = np.asarray(starts, dtype=np.int64)
    if not shuffle:
        return np.arange(int(starts[-1]), dtype=np.int64)
    levels = np.unique(generations) if generations is not None and len(generations) else np.zeros(1, np.int64)
    if len(levels) == 1:
        return _shuffled(starts, [seed, epoch], window)
    assert generations is not None
    orders = []
    for g in levels.tolist():
        units = np.flatnonzero(generations == g)
        sizes = starts[units + 1] - starts[units]
        rows = np.repeat(starts[units] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
        key = [seed, epoch] if g == levels[0] else [seed, epoch, 2, int(g)]
        orders.append(rows[_shuffled(np.concatenate([[0], np.cumsum(sizes)]), key, window)])
    return interleave(orders, [seed, epoch, 3])


def _shuffled(starts: np.ndarray, key: list[int], window: int) -> np.ndarray:
    """`epoch_order` of one generation: row groups permuted (rng `key`), rows inside windows (rng key + [1])."""
    units = np.random.default_rng(key).permutation(len(starts) - 1).astype(np.int64)
    sizes = starts[1:][units] - starts[:-1][units]
    rows = np.repeat(starts[:-1][units] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    rng = np.random.default_rng([*key, 1])
    bounds = np.concatenate([[0], np.cumsum(sizes)])[::window].tolist() + [len(rows)]
    for a, b in itertools.pairwise(bounds):
        rng.shuffle(rows[a:b])
    return rows


def partitioned_order(
    starts: np.ndarray,
    seed: int,
    epoch: int,
    canonical: int,
    shuffle: bool = True,
    window: int = 4,
    generations: np.ndarray | None = None,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """Every kept row once (`keep[row]`, all rows when None), node-aware: position k holds row k // C of canonical
    partition k mod C (`canonical_partitions`: fixed for the run); each partition ordered per (seed, epoch) as
    `epoch_order` orders a split (its pieces of row groups shuffled, rows inside windows of `window` pieces; an
    appended generation's pieces ordered apart and interleaved at random). A function of (seed, epoch, C)."""
    check_window(window)
    rows, bounds = canonical_partitions(starts, seed, canonical, shuffle, keep)
    unit_of = np.searchsorted(np.asarray(starts, dtype=np.int64), rows, side="right") - 1
    merged = np.empty(len(rows), dtype=np.int64)
    for c in range(canonical):
        part, units = rows[bounds[c] : bounds[c + 1]], unit_of[bounds[c] : bounds[c + 1]]
        if shuffle:
            part = _partition_epoch(part, units, [seed, epoch, 7, c], window, generations)
        merged[c::canonical] = part
    return merged


def canonical_partitions(
    starts: np.ndarray, seed: int, canonical: int, shuffle: bool = True, keep: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, bounds): the kept rows with their row groups in the run's order (rng [seed, 6]: the same every
    epoch, so each node reads the same row groups each epoch), and the C + 1 bounds that cut them into C canonical
    partitions, the first (total mod C) one row larger. Row groups at a bound are shared by two partitions."""
    check_canonical(canonical)
    starts = np.asarray(starts, dtype=np.int64)
    count = len(starts) - 1
    units = np.random.default_rng([seed, 6]).permutation(count) if shuffle else np.arange(count)
    sizes = starts[1:][units] - starts[:-1][units]
    rows = np.repeat(starts[:-1][units] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    if keep is not None:
        rows = rows[np.asarray(keep, dtype=bool)[rows]]
    share, extra = divmod(len(rows), canonical)
    bounds = np.arange(canonical + 1, dtype=np.int64) * share + np.minimum(np.arange(canonical + 1), extra)
    return rows, bounds


def _partition_epoch(
    rows: np.ndarray, units: np.ndarray, key: list[int], window: int, generations: np.ndarray | None
) -> np.ndarray:
    """One partition's rows in this epoch's order: its pieces (runs of one row group) shuffled and rows shuffled
    inside windows of `window` pieces (rng `key`); pieces of several generations ordered apart, then interleaved."""
    levels = np.unique(generations[units]) if generations is not None and len(rows) else np.zeros(1, np.int64)
    if len(levels) == 1:
        return _pieces_shuffled(rows, units, key, window)
    assert generations is not None
    orders = []
    for g in levels.tolist():
        mine = generations[units] == g
        orders.append(_pieces_shuffled(rows[mine], units[mine], [*key, 2, int(g)], window))
    return interleave(orders, [*key, 3])


def _pieces_shuffled(rows: np.ndarray, units: np.ndarray, key: list[int], window: int) -> np.ndarray:
    """`rows` (runs of equal `units`: pieces of row groups) with the pieces permuted (rng `key`) and the rows
    shuffled inside each window of `window` consecutive pieces (rng key + [1])."""
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(units)) + 1, [len(rows)]]).astype(np.int64)
    shuffled: np.ndarray = rows[_shuffled(cuts, key, window)]
    return shuffled


def interleave(orders: list[np.ndarray], key: list[int]) -> np.ndarray:
    """`orders` merged, each kept in its own order, at positions drawn at random (rng `key`): a uniform random
    interleave, so every position holds order i with probability len(orders[i]) / total."""
    which = np.random.default_rng(key).permutation(np.repeat(np.arange(len(orders)), [len(o) for o in orders]))
    merged = np.empty(len(which), dtype=np.int64)
    for i, order in enumerate(orders):
        merged[which == i] = order
    return merged


def check_window(window: int) -> None:
    if window < 1:
        raise ValueError(f"window: expected >= 1 row groups, found {window}")


def check_canonical(canonical: object) -> None:
    if not isinstance(canonical, int) or isinstance(canonical, bool) or not 1 <= canonical <= MAX_CANONICAL_NODES:
        raise ValueError(
            f"canonical_nodes: expected an int in [1, {MAX_CANONICAL_NODES}] (the canonical partitions of the epoch "
            f"order, e.g. {DEFAULT_CANONICAL_NODES}), or None for the order that is not node-aware, found {canonical!r}"
        )


def check_nodes(world_size: int, nodes: int, canonical: int | None) -> None:
    """`nodes` must divide the world size and, for the node-aware order, the canonical partition count."""
    if nodes < 1 or world_size % nodes:
        raise ValueError(
            f"ranks_per_node: expected a divisor of world_size={world_size} (torchrun's LOCAL_WORLD_SIZE: every node "
            f"runs the same number of ranks), found {world_size / max(nodes, 1):g} ranks per node ({nodes} nodes)"
        )
    if canonical is not None and canonical % nodes:
        raise ValueError(
            f"canonical_nodes: expected a multiple of the number of nodes ({nodes}: world_size {world_size} / "
            f"{world_size // nodes} ranks per node), found {canonical}; pass canonical_nodes= a multiple of every node "
            "count the run may use (e.g. 64 for 1, 2, 4, 8, 16 nodes; 240 for 1-6, 8, 10, 12 nodes) — the same "
            "value on every run you resume across"
        )


def node_slot(rank: int, world_size: int, nodes: int, origin: int) -> int:
    """The interleave slot of `rank` (ranks numbered node by node: node rank // (world_size / nodes)) among the W
    slots of each block of positions, such that every position of the slot is on its own node: origin + slot
    ≡ node (mod nodes), the partitions (k mod C, C a multiple of nodes) that node reads."""
    node, local = divmod(rank, world_size // nodes)
    return local * nodes + (node - origin) % nodes


def check_topology(rank: int, world_size: int, uneven: str) -> None:
    if uneven not in UNEVEN:
        raise ValueError(f"uneven: expected one of {UNEVEN}, found {uneven!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, found {rank}")


def rank_count(total: int, origin: int, rank: int, world_size: int, uneven: str = "keep") -> int:
    """How many positions rank `rank` yields from `origin` to the end of the epoch."""
    check_topology(rank, world_size, uneven)
    left = max(0, total - origin)
    if uneven == "keep":
        return max(0, -(-(left - rank) // world_size))
    return left // world_size if uneven == "drop" else -(-left // world_size)


def rank_positions(total: int, origin: int, rank: int, world_size: int, uneven: str = "keep") -> np.ndarray:
    """The positions of the epoch order rank `rank` yields, in order: origin + m·world_size + rank ("pad": past
    the end they wrap to the epoch's first positions)."""
    count = rank_count(total, origin, rank, world_size, uneven)
    positions = origin + rank + world_size * np.arange(count, dtype=np.int64)
    return positions % total if uneven == "pad" and total else positions


def worker_positions(count: int, chunk: int, worker: int, workers: int, done: int = 0) -> np.ndarray:
    """The indices into a rank's `count` positions that DataLoader worker `worker` of `workers` yields, in order:
    chunks t ≡ worker (mod workers) of `chunk` positions, leaving out those before `done` (a resumed worker
    continues inside its own chunk, or at its next one)."""
    if chunk < 1:
        raise ValueError(f"batch_size: expected >= 1, found {chunk}")
    local = np.arange(min(done, count), count, dtype=np.int64)
    mine: np.ndarray = local[(local // chunk) % workers == worker]
    return mine


@dataclass(frozen=True)
class Position:
    """Where an epoch stands: `origin`, the position this pass over it started at (0, or where a resume on
    another topology began), and `seen`, the global positions consumed (origin + local·world_size, or the total
    once the rank is done). `topology` is (world_size, workers, chunk, nodes) of the run that saved it, or None for a
    state built by the training loop (`{"epoch": e, "samples_seen": n}`): then a resume starts at `seen` on any
    topology."""

    epoch: int
    origin: int
    seen: int
    topology: tuple[int, int, int, int] | None = None

    def to_state(self, seed: int, total: int) -> dict[str, Any]:
        state: dict[str, Any] = {"version": STATE_VERSION, "seed": seed, "num_samples": total}
        state.update(epoch=self.epoch, samples_seen=self.seen, origin=self.origin)
        if self.topology is not None:
            state["topology"] = list(self.topology)
        return state

    @classmethod
    def from_state(cls, state: Any, seed: int, total: int) -> Position:
        """Checked, every field (one ValueError naming the field, the value found and the valid range): the same
        seed and number of images (another order or another dataset cannot be resumed), counts in range."""
        if not isinstance(state, Mapping) or not {"epoch", "samples_seen"} <= set(state):
            raise ValueError(
                f"state: expected a dict with 'epoch' and 'samples_seen' (from state_dict(), or built by the "
                f"training loop), found {_shown(state)}"
            )
        if "version" in state:
            _field(state, "version", STATE_VERSION, STATE_VERSION, "the only state version this reader knows")
        for key, mine in (("seed", seed), ("num_samples", total)):
            if key in state and _integer(state[key]) != mine:
                raise ValueError(
                    f"state['{key}']: expected {key}={mine} (this dataset/sampler), found {key}={_shown(state[key])}; "
                    "a resume needs the same seed and the same shards as the run that saved the state"
                )
        epoch = _field(state, "epoch", 0, MAX_INT, "an epoch number")
        seen = _field(state, "samples_seen", 0, total, "positions of the epoch consumed")
        origin = seen
        if "origin" in state:
            origin = _field(state, "origin", 0, seen, "where this pass began, <= samples_seen")
        topology = state.get("topology")
        if topology is None:  # a state built by the training loop: its count is global, any topology resumes there
            return cls(epoch, seen, seen)
        return cls(epoch, origin, seen, _topology(topology))

    def local_done(self, world_size: int) -> int:
        """Positions of each rank already consumed since `origin`."""
        return (self.seen - self.origin) // world_size


def _integer(value: Any) -> int | None:
    """`value` as an int when it is one (int, numpy or 0-d torch integer); None for bools, floats, strings, None."""
    dtype = getattr(value, "dtype", None)  # numpy / torch: a 0-d integer, not a bool nor a 1-element array
    if isinstance(value, bool) or (dtype is not None and ("bool" in str(dtype) or getattr(value, "ndim", 0) != 0)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _field(state: Mapping[str, Any], key: str, low: int, high: int, what: str) -> int:
    """state[key], an int in [low, high]; else one ValueError naming the key, the value and the range."""
    number = _integer(state[key])
    if number is None or not low <= number <= high:
        raise ValueError(
            f"state['{key}']: expected an int in [{low}, {high}] ({what}), found {_shown(state[key])}; {STATE_HELP}"
        )
    return number


def _topology(value: Any) -> tuple[int, int, int, int]:
    """A saved (world_size, workers, batch size, nodes): four ints in [1, MAX_TOPOLOGY] (three from a reader
    before node-aware orders: one node)."""
    numbers = [_integer(v) for v in value] if isinstance(value, (list, tuple)) else []
    if len(numbers) not in (3, 4) or not all(n is not None and 1 <= n <= MAX_TOPOLOGY for n in numbers):
        raise ValueError(
            f"state['topology']: expected [world_size, num_workers, batch_size, nodes], four ints in "
            f"[1, {MAX_TOPOLOGY}] (saved by state_dict()), found {_shown(value)}; {STATE_HELP}"
        )
    world, workers, chunk, *nodes = (int(n or 0) for n in numbers)
    return (world, workers, chunk, nodes[0] if nodes else 1)

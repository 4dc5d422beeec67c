"""Pure sharding arithmetic for the iterable dataset: which rows of which row groups a (rank, worker) reads.

One epoch = the row groups in a (seed, epoch)-shuffled order, concatenated into one sequence of N rows. Rank r
takes a contiguous range of that sequence, and worker w a contiguous range of its rank's range, so each process
reads whole row groups except at most two partial ones at its ends.

`uneven` says what happens when N is not a multiple of world_size:
  * "keep": every row exactly once per epoch; rank sizes differ by at most 1 (floor/ceil of N / world_size).
  * "drop": every rank yields floor(N / world_size); the last N mod world_size rows of this epoch's order
    (different rows each epoch when shuffled) are skipped.
  * "pad":  every rank yields ceil(N / world_size); the sequence wraps around, so the first few rows of this
    epoch's order are yielded twice (as torch's DistributedSampler does).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

UNEVEN = ("keep", "drop", "pad")


def unit_order(num_units: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of row groups for an epoch; identical in every rank and worker."""
    if not shuffle:
        return np.arange(num_units, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_units).astype(np.int64)


def rank_range(total: int, rank: int, world_size: int, uneven: str = "keep") -> tuple[int, int]:
    """[start, stop) of the epoch sequence for `rank`; stop may exceed `total` with uneven="pad" (wraps)."""
    if uneven not in UNEVEN:
        raise ValueError(f"uneven: expected one of {UNEVEN}, found {uneven!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, found {rank}")
    if uneven == "keep":
        return rank * total // world_size, (rank + 1) * total // world_size
    per_rank = total // world_size if uneven == "drop" else -(-total // world_size)
    return rank * per_rank, (rank + 1) * per_rank


def split_range(start: int, stop: int, part: int, parts: int) -> tuple[int, int]:
    """The `part`-th of `parts` contiguous, near-equal pieces of [start, stop)."""
    size = stop - start
    return start + part * size // parts, start + (part + 1) * size // parts


def row_slices(sizes: np.ndarray, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """(position in `sizes`, first row, end row) covering [start, stop) of the concatenated sequence.

    Positions at or past the total wrap around to the beginning (used by uneven="pad")."""
    total = int(sizes.sum())
    if total == 0:
        return
    ends = np.cumsum(sizes)
    pos = start
    while pos < stop:
        p = pos % total
        i = int(np.searchsorted(ends, p, side="right"))
        first = int(ends[i] - sizes[i])
        end = min(int(ends[i]), p + (stop - pos))
        yield i, p - first, end - first
        pos += end - p

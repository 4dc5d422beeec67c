"""Near-duplicate searches kept in the validate stage's scratch space (`<paths.work>/validate/near/`).

A search's result is a function of its inputs alone (the fingerprints of the rows searched, the distance, whether
it is a self-join), so it is kept under a SHA-256 of them and reused while they are unchanged: a curation round
changes labels and keep flags, never a fingerprint, and the searches run over every fingerprinted row (the pairs
of excluded rows are dropped after), so it searches nothing again (at ImageNet-1k ~12 of validate's ~50 CPU-s).

Trust nothing from disk: a kept file is used only when it parses, its indices are inside the inputs and every
stored distance equals the one recomputed from the fingerprints and is within the search distance; else it is
searched again and replaced (written atomically). `prune()` removes the files this run did not use."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.common import atomic_path

NEAR_DIR = "near"  # under the validate work directory, beside scan/
VERSION = "near-pairs-v1"  # in every key: a change of what a search returns makes the kept files unused
Search = Callable[[np.ndarray, np.ndarray, int, bool], pd.DataFrame]  # near_dup.near_pairs
Count = Callable[[np.ndarray], np.ndarray]  # near_dup.popcount: set bits per uint64


class PairCache:
    """Searches kept under `directory` (None: nothing kept, every search runs); `popcount` checks a kept result's
    distances."""

    def __init__(self, directory: Path | None, popcount: Count) -> None:
        self.directory, self.popcount, self.used = directory, popcount, set[str]()

    def pairs(
        self, queries: np.ndarray, indexed: np.ndarray, distance: int, self_join: bool, search: Search
    ) -> pd.DataFrame:
        """`search(queries, indexed, distance, self_join)`, or its kept result."""
        if self.directory is None:
            return search(queries, indexed, distance, self_join)
        digest = hashlib.sha256(f"{VERSION}:{distance}:{self_join}:{len(queries)}:".encode())
        digest.update(np.ascontiguousarray(queries, dtype=np.uint64).tobytes())
        digest.update(np.ascontiguousarray(indexed, dtype=np.uint64).tobytes())
        path = self.directory / f"{digest.hexdigest()}.npz"
        self.used.add(path.name)
        kept = _load(path, queries, indexed, distance, self_join, self.popcount)
        if kept is not None:
            return kept
        found = search(queries, indexed, distance, self_join)
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as out:
            np.savez(out, **{k: found[k].to_numpy(np.int64) for k in ("query", "indexed", "distance")})
        return found

    def prune(self) -> None:
        """Remove the kept searches this run did not use."""
        if self.directory is None or not self.directory.is_dir():
            return
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".npz") and name not in self.used:
                (self.directory / name).unlink(missing_ok=True)


def _load(
    path: Path, queries: np.ndarray, indexed: np.ndarray, distance: int, self_join: bool, popcount: Count
) -> pd.DataFrame | None:
    """The kept result at `path` when it is whole and agrees with the fingerprints; else None."""
    try:
        with np.load(path, allow_pickle=False) as kept:
            q, t, d = (np.asarray(kept[k], dtype=np.int64) for k in ("query", "indexed", "distance"))
    except (OSError, ValueError, KeyError):
        return None
    if not (len(q) == len(t) == len(d)):
        return None
    if len(q) and (q.min() < 0 or t.min() < 0 or q.max() >= len(queries) or t.max() >= len(indexed)):
        return None
    if len(q) and (np.any(d > distance) or np.any(popcount(queries[q] ^ indexed[t]) != d)):
        return None
    if self_join and np.any(q >= t):
        return None
    return pd.DataFrame({"query": q, "indexed": t, "distance": d})

"""Shard planning: which manifest rows go to which shard (deterministic, from the manifest alone), and resume
checks (a shard finished for the same plan is kept)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class ShardPlan:
    """Rows [start, stop) of one split's manifest go to shard `index` of `count`; `key` identifies inputs+params."""

    split: str
    index: int
    count: int
    start: int
    stop: int
    input_bytes: int
    key: str

    @property
    def name(self) -> str:
        return f"{self.split}-{self.index:05d}-of-{self.count:05d}.parquet"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_ranges(sizes: Iterable[int], target_bytes: int) -> list[tuple[int, int, int]]:
    """Cut rows into consecutive, balanced ranges of about `target_bytes` of input: (start, stop, bytes).

    n = ceil(total / target) ranges, cut where the running total first reaches k·total/n, so the ranges are of
    about equal size (two shards of 184 MB, not 256 + 112: the processes finish together). The cut depends only
    on the sizes and the target — never on the worker count. An empty input gives one empty range."""
    sizes = list(sizes)
    total = sum(sizes)
    count = max(1, -(-total // target_bytes))
    bounds = [0]
    running = 0
    for row, size in enumerate(sizes[:-1]):
        running += size
        if len(bounds) < count and running * count >= len(bounds) * total:
            bounds.append(row + 1)
    bounds.append(len(sizes))
    return [(a, b, sum(sizes[a:b])) for a, b in itertools.pairwise(bounds)]


def plan_split(split: str, sizes: list[int], target_bytes: int, base_key: str) -> list[ShardPlan]:
    ranges = plan_ranges(sizes, target_bytes)
    plans = []
    for index, (start, stop, nbytes) in enumerate(ranges):
        key = hashlib.sha256(f"{base_key}:{split}:{index}:{len(ranges)}:{start}:{stop}".encode()).hexdigest()
        plans.append(ShardPlan(split, index, len(ranges), start, stop, nbytes, key))
    return plans


def finished_stats(plan: ShardPlan, shard: Path, stats_path: Path) -> dict[str, Any] | None:
    """The stats of a shard already written for exactly this plan, else None (the shard is then redone).

    Trusted when the stats carry this plan's key (inputs + output params + versions) and the file's size and
    Parquet footer (rows, row groups) agree with them. Shards only ever appear under their final name complete
    (atomic rename), so this catches a replaced or damaged file without re-reading every byte."""
    try:
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        if stats.get("key") != plan.key or shard.stat().st_size != stats.get("file_bytes"):
            return None
        meta = pq.read_metadata(shard)
    except (OSError, ValueError, pa.ArrowException):
        return None
    return stats if (meta.num_rows, meta.num_row_groups) == (stats["count"], stats["row_groups"]) else None


def remove_stale(directory: Path, keep: set[str]) -> list[str]:
    """Delete shards of an older plan and temp files left by a killed run (only inside `directory`)."""
    removed = []
    if directory.is_dir():
        for entry in sorted(directory.iterdir()):
            if entry.is_file() and entry.name not in keep:
                entry.unlink()
                removed.append(entry.name)
    return removed

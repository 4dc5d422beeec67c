"""Shard planning: which manifest rows go to which shard (deterministic, from the manifest alone), and resume
checks (a shard finished for the same plan is kept).

The row order (`order_rows`, `convert.order`): `hashed` (default) puts a split's rows in the order of a keyed
hash of the image name (its identity: unchanged by a relabel), so every row group, every shard and any
sequential read is a uniform sample of the classes; `class` keeps the manifest's (wnid, name) order.

The layout is content-defined (`content_ranges`): cuts and names come from the rows themselves, so a new version
of the dataset rewrites only the shards holding a change (plus at most a neighbour), and every other shard keeps
its name, key and bytes — DVC stores, pushes and pulls only what changed. In hashed order a removed or
relabelled image touches one shard, but a new class spreads over (and rewrites) most shards; in class order a
new class rewrites the shards around it, a relabel the two it moves between."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.common.manifests import int64_values

# The content-defined layout cuts a new shard where the row key (wnid, name) hashes under a threshold, so a cut
# depends on that row (and the bytes since the previous cut) only: adding, removing or relabelling images moves
# the cuts of the shards around them, never the cuts further on. Shards hold MIN..MAX of the target (mean ~ 1).
# Past the target a hit is NORMALIZE times likelier, so a shard almost never reaches MAX (a cut forced there would
# move with every insertion before it, and the shards after it too, until the next hit).
MIN_FRACTION, MAX_FRACTION, NORMALIZE = 0.5, 2.0, 4
ORDERS = ("hashed", "class")  # convert.order
ORDER_KEY = b"imagenet-parquet/order/v1"  # the key of the order hash (a new key = a new order of every split)
TIE_KEY = b"imagenet-parquet/order-tie/v1"  # equal names (`0001.jpg` in every class): their classes' keyed order
LAYOUTS = ("content", "size")  # size: the former balanced ranges named -NNNNN-of-NNNNN (benchmarks compare them)
PLAN_COLUMNS = ["label", "wnid", "name", "source", "member", "offset", "size"]  # a shard's identity (its rows)
BATCH = 1 << 16  # rows turned into Python objects at a time
_SAFE_NAME = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_.]{0,159}")
_HASHED_TOKEN = re.compile(r"~[0-9a-f]{20}")  # `_file_token` of a name outside _SAFE_NAME
_HASHED_STEM = re.compile(r"h[0-9a-f]{16}")  # `_stems` in hashed order
_REPEAT = re.compile(r"[2-9]|[1-9][0-9]+")  # `-2`, `-3`... after a stem met before in the split
SHARD_STEMS = "stem h<16 hex>, <class>-<first image> or empty; docs/CONTRACTS.md"
SHARD_NAMES = f"<split>[-g<N>]-<stem>.parquet ({SHARD_STEMS})"


@dataclass(frozen=True)
class ShardPlan:
    """Rows [start, stop) of one split's manifest go to shard `index` of `count`, file `<split>-<stem>.parquet`;
    `key` identifies the shard's rows + the inputs and params shared by all shards."""

    split: str
    index: int
    count: int
    start: int
    stop: int
    input_bytes: int
    key: str
    stem: str
    generation: int = 0  # >= 1: appended after the first conversion (tasks/convert/history.py)

    @property
    def name(self) -> str:
        return f"{self.split}-{self.stem}.parquet"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_ranges(sizes: Iterable[int], target_bytes: int) -> list[tuple[int, int, int]]:
    """The size layout: consecutive, balanced ranges of about `target_bytes` of input: (start, stop, bytes).

    n = ceil(total / target) ranges, cut where the running total first reaches k·total/n. Any insertion or removal
    moves every later cut (kept for comparison: `benchmarks/bench_versions.py`). An empty input gives one range."""
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
    return _ranges(sizes, bounds)


def content_ranges(keys: Iterable[str], sizes: Iterable[int], target_bytes: int) -> list[tuple[int, int, int]]:
    """The content layout: row i starts a new shard when the shard so far holds >= MIN·target bytes and the hash
    of its key hits (probability size_i / ((1 - MIN)·target), NORMALIZE x that past the target: shards average
    ~0.9 target), or when row i would take the shard over MAX·target. Depends on the rows only — never on the
    worker count. Empty input: one range. Streams: holds no per-row list (13 M rows)."""
    low, high = int(MIN_FRACTION * target_bytes), int(MAX_FRACTION * target_bytes)
    span = max(1, target_bytes - low)
    ranges, start, running, rows = [], 0, 0, 0
    for row, (key, size) in enumerate(zip(keys, sizes, strict=True)):
        odds = size * (NORMALIZE if running >= target_bytes else 1)  # past the target: cuts come sooner
        if running and (running + size > high or (running >= low and _hash64(key) * span < odds << 64)):
            ranges.append((start, row, running))
            start, running = row, 0
        running += size
        rows = row + 1
    return [*ranges, (start, rows, running)]


def _ranges(sizes: list[int], bounds: list[int]) -> list[tuple[int, int, int]]:
    return [(a, b, sum(sizes[a:b])) for a, b in itertools.pairwise(bounds)]


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def row_key(wnid: str, name: str) -> str:
    """The key a row is known by across versions (the manifest's sort key)."""
    return f"{wnid}/{name}"


def shard_stem(wnid: str, name: str) -> str:
    """`<class>-<first image name>` of a shard's first row: unique in the split, unchanged while that row leads the
    shard, and sorting like the manifest for names of [0-9A-Za-z_.] (others — an image or a class folder named
    otherwise — `~` + a hash of the name)."""
    return f"{_file_token(wnid)}-{_file_token(name)}"


def _file_token(name: str) -> str:
    if _SAFE_NAME.fullmatch(name) and ".parquet" not in name:
        return name
    return "~" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def order_hash(name: str) -> bytes:
    """The keyed hash that places an image in hashed order (BLAKE2b keyed with ORDER_KEY, 16 bytes): a function
    of the image name alone, independent of the content-defined cut hash (`_hash64`, SHA-256)."""
    return hashlib.blake2b(name.encode(), digest_size=16, key=ORDER_KEY).digest()


@dataclass(frozen=True)
class Rows:
    """A split's manifest rows in an order: `table` (as stored) taken through `indices` (None: as stored), a
    batch or a shard at a time — never a second copy of the manifest (13 M rows: ~0.9 GB once, not twice)."""

    table: pa.Table
    indices: pa.Array | None = None

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)

    def slice(self, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
        """Rows [start, stop) of the order (all columns, or `columns`)."""
        table = self.table if columns is None else self.table.select(columns)
        if self.indices is None:
            return table.slice(start, stop - start)
        return table.take(self.indices.slice(start, stop - start))

    def values(self, column: str) -> Iterator[Any]:
        """A column's Python values in the order, BATCH rows at a time (never the whole column as objects)."""
        for first in range(0, self.num_rows, BATCH):
            yield from self.slice(first, min(self.num_rows, first + BATCH), [column]).column(0).to_pylist()


def ordered(table: pa.Table, order: str) -> Rows:
    """A split's manifest rows (sorted by wnid, name, ...) in `order`: `class` keeps them; `hashed` sorts by
    (order_hash(name), then class_tie(wnid), then the manifest order — the sort is stable). Distinct names never
    tie, so the class tie moves nothing of a source whose names are unique (ImageNet); one name in every class
    (`0001.jpg`) puts that name's rows in a keyed order of their classes instead of class order, so a row group
    of them mixes the classes instead of holding a contiguous range. Holds 24 + 8 bytes per row besides the table."""
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, found {order!r}")
    if order == "class" or table.num_rows == 0:
        return Rows(table)
    names = Rows(table).values("name")
    wnids = Rows(table).values("wnid") if "wnid" in table.column_names else itertools.repeat(None)
    width = 24 if "wnid" in table.column_names else 16
    hashes = pa.chunked_array(
        [
            pa.array(
                [order_hash(next(names)) + class_tie(next(wnids)) for _ in range(min(BATCH, table.num_rows - first))],
                pa.binary(width),
            )
            for first in range(0, table.num_rows, BATCH)
        ],
        pa.binary(width),
    )
    return Rows(table, pc.sort_indices(hashes))


@functools.lru_cache(maxsize=1 << 16)
def class_tie(wnid: str | None) -> bytes:
    """The tie-break of equal names in hashed order: BLAKE2b-64 of the class keyed with TIE_KEY (b"" without)."""
    if wnid is None:
        return b""
    return hashlib.blake2b(wnid.encode("utf-8", "surrogateescape"), digest_size=8, key=TIE_KEY).digest()


def order_rows(table: pa.Table, order: str) -> pa.Table:
    """`ordered` as one table (a copy: for tests and benchmarks; the planner keeps the `Rows` view)."""
    return ordered(table, order).slice(0, table.num_rows)


def plan_split(
    split: str, rows: Rows | pa.Table, target_bytes: int, base_key: str, layout: str = "content", order: str = "hashed"
) -> list[ShardPlan]:
    """The shards of one split's manifest `rows` (PLAN_COLUMNS, already in `order`: `ordered`) in `layout`.

    Class order cuts on the (wnid, name) key and names shards `<wnid>-<first image>`; hashed order cuts on the
    name alone (a relabel moves no cut) and names shards by the order hash of their first image (sorting like
    the rows)."""
    rows = rows if isinstance(rows, Rows) else Rows(rows)
    if layout == "size":
        ranges = plan_ranges(rows.values("size"), target_bytes)
    else:
        names = rows.values("name")
        keys = names if order == "hashed" else map(row_key, rows.values("wnid"), names)
        ranges = content_ranges(keys, rows.values("size"), target_bytes)
    firsts = [_first(rows, start) if stop > start else None for start, stop, _ in ranges]
    plans = []
    for index, ((start, stop, nbytes), stem) in enumerate(zip(ranges, _stems(firsts, layout, order), strict=True)):
        digest = hashlib.sha256(f"{base_key}:{split}:{layout}:{order}:{stem}".encode())
        _digest_rows(digest, rows.slice(start, stop, PLAN_COLUMNS))
        plans.append(ShardPlan(split, index, len(ranges), start, stop, nbytes, digest.hexdigest(), stem))
    return plans


def _digest_rows(digest: Any, table: pa.Table) -> None:
    """Feed a shard's rows to `digest` from Arrow's buffers, a column at a time (no Python object per row): an
    integer column as little-endian int64, a string column as its values' lengths (int64) then their bytes."""
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        if column.null_count:
            raise ValueError(f"manifest column {name!r}: expected no nulls, found {column.null_count}")
        digest.update(name.encode() + b"\0")
        if pa.types.is_integer(column.type):
            digest.update(int64_values(column).astype("<i8").tobytes())
            continue
        column = column.cast(pa.large_string())
        offsets = np.frombuffer(column.buffers()[1], "<i8")[column.offset : column.offset + len(column) + 1]
        digest.update(np.diff(offsets).astype("<i8").tobytes())
        digest.update(memoryview(column.buffers()[2])[offsets[0] : offsets[-1]] if len(column) else b"")


def _first(rows: Rows, row: int) -> tuple[str, str]:
    first = rows.slice(row, row + 1, ["wnid", "name"]).to_pylist()[0]
    return first["wnid"], first["name"]


def _stems(firsts: list[tuple[str, str] | None], layout: str, order: str) -> list[str]:
    """Each shard's file stem from its first row's (wnid, name) (None: empty): `NNNNN-of-NNNNN` (size layout),
    `<wnid>-<first image>` (class order) or `h<16 hex digits of the first image's order hash>` (hashed order;
    `-2`, `-3`... on the rare equal name)."""
    if layout == "size":
        return [f"{i:05d}-of-{len(firsts):05d}" for i in range(len(firsts))]
    stems: list[str] = []
    seen: dict[str, int] = {}
    for first in firsts:
        if first is None:
            stem = "empty"
        elif order == "hashed":
            stem = "h" + order_hash(first[1]).hex()[:16]
        else:
            stem = shard_stem(*first)
        seen[stem] = seen.get(stem, 0) + 1
        stems.append(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}")
    return stems


def shard_name_ok(name: str, split: str, generation: int) -> bool:
    """`name` is one `plan_split` gives a shard of `split` in `generation` (>= 1: `<split>-g<N>-<stem>`, the
    appended generations' prefix, tasks/convert/history.py): SHARD_NAMES, a stem `_stems` writes — never a hidden
    file, a path, or another split's or generation's name."""
    prefix = f"{split}-g{generation}-" if generation else f"{split}-"
    return name.startswith(prefix) and name.endswith(".parquet") and _stem_ok(name[len(prefix) : -len(".parquet")])


def _stem_ok(stem: str) -> bool:
    """`empty`, `h<16 hex>` or `<token>-<token>` (`_file_token`s), either with a repeat number `-<n>`."""
    parts = stem.split("-")
    if len(parts) > 1 and _REPEAT.fullmatch(parts[-1]) and (len(parts) == 3 or _HASHED_STEM.fullmatch(parts[0])):
        parts = parts[:-1]
    if len(parts) == 1:
        return parts[0] == "empty" or bool(_HASHED_STEM.fullmatch(parts[0]))
    return len(parts) == 2 and all(_token_ok(token) for token in parts)


def _token_ok(token: str) -> bool:
    return bool(_HASHED_TOKEN.fullmatch(token)) or (_file_token(token) == token and not token.startswith("~"))


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

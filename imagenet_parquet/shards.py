"""Shard discovery, the row-group index and lazy per-process reads (row groups, or one image via the byte index).

Nothing here keeps a file open across pickling: `RowGroupReader` opens `pq.ParquetFile` handles on first use in
the process that reads (each DataLoader worker), and drops them (and its cache) when pickled or forked.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import (
    LABEL_MAP_KEYS,
    FormatError,
    label_map_from_metadata,
    own_label_map,
    shard_generation,
)
from .overlay import Overlay, footer_digest, overlay_path, resolve_overlay, tail_at, view_path

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class RowGroupSource(Protocol):
    """Where row groups come from when the shards are not local files (remote.RemoteShards)."""

    def read_row_group(self, file: int, group: int, columns: Sequence[str]) -> pa.Table: ...


def find_shards(source: Source, split: str | None = None) -> list[Path]:
    """Resolve `source` to a sorted list of shard files.

    `source` is a shard file, a directory of shards (`data/parquet/train`), the Parquet root plus `split`
    (`data/parquet`, split="train"), or an explicit list of files (kept in the given order)."""
    if not isinstance(source, (str, os.PathLike)):
        files = [Path(p) for p in source]
    else:
        root = Path(source)
        if split is not None:
            root = root / split
        files = [root] if root.is_file() else sorted(root.glob("*.parquet")) if root.is_dir() else []
    if not files:
        where = Path(source) / split if split and isinstance(source, (str, os.PathLike)) else source
        raise FileNotFoundError(
            f"{where}: expected Parquet shards (a .parquet file or a directory of *.parquet), found none; "
            "run `dvc pull data/parquet` (or `dvc repro`) first, or pass the shard directory"
        )
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"expected Parquet shard files, these do not exist: {missing[:5]}")
    return files


def whole_split(source: Source, split: str | None = None) -> bool:
    """True when `source` names a directory of shards (a split read whole), not files picked by name."""
    return isinstance(source, (str, os.PathLike)) and (Path(source) / (split or "")).is_dir()


def row_group_span(meta: pq.FileMetaData, group: int) -> tuple[int, int]:
    """(first, end) byte offsets of row group `group`'s column chunks (dictionary pages included)."""
    rg = meta.row_group(group)
    first, end = None, 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None:
            start = min(start, col.dictionary_page_offset)
        first = start if first is None else min(first, start)
        end = max(end, start + col.total_compressed_size)
    return (first or 0), end


def willneed(path: str | os.PathLike[str], ranges: Sequence[tuple[int, int]]) -> None:
    """Ask the kernel to start reading (offset, length) `ranges` of `path` into the page cache, without waiting
    (POSIX_FADV_WILLNEED); a no-op where posix_fadvise does not exist."""
    if not hasattr(os, "posix_fadvise") or not ranges:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, length in ranges:
            os.posix_fadvise(fd, int(offset), int(length), os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


STALE = (
    "the shard was replaced or removed after this dataset was built (a `dvc repro`, `dvc pull` or `dvc checkout` "
    "while it was in use): build the dataset again (restart the run; its order and labels were those of the old "
    "shards), or restore the shards it was built from"
)


def _gone(path: Path) -> FormatError:
    return FormatError(f"{path}: expected the shard this dataset was built from, found no file; {STALE}")


def parse_footer(tail: bytes, where: str | os.PathLike[str]) -> pq.FileMetaData:
    """The metadata of a Parquet footer `tail` (footer, length, PAR1), as `footer_tail` reads it."""
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + tail))
    except (OSError, pa.ArrowException) as err:
        raise FormatError(
            f"{where}: expected a Parquet footer that parses, found: {err}; `dvc pull` it again (or re-run convert)"
        ) from None


def read_footers(files: Sequence[Path]) -> tuple[list[pq.FileMetaData], list[str]]:
    """Each file's footer metadata and footer SHA-256 (overlay.footer_digest), from one read of its tail."""
    metas, digests = [], []
    for path in files:
        with open(path, "rb") as fh:
            tail = tail_at(lambda n, at: os.pread(fh.fileno(), n, at), os.fstat(fh.fileno()).st_size, path)
        metas.append(parse_footer(tail, path))
        digests.append(footer_digest(tail))
    return metas, digests


def label_maps_of(
    files: Sequence[Path], metadata: Sequence[pq.FileMetaData], own_only: bool
) -> tuple[list[dict[str, Any]], list[int]]:
    """The distinct label maps of the shards (in order of first appearance) and, per file, the position of its own
    (-1: none; `own_only`: an explicit label map was given, so shards without one in `imagenet_parquet` are fine)."""
    maps: list[dict[str, Any]] = []
    map_of: list[int] = []
    parsed: dict[tuple[bytes | None, ...], int] = {}  # one parse per distinct metadata value
    for path, meta in zip(files, metadata, strict=True):
        raw = tuple((meta.metadata or {}).get(key) for key in LABEL_MAP_KEYS)
        if raw not in parsed:  # 19,000 classes: ~1 MB of JSON a shard, the same in every shard of a split
            this = own_label_map(meta.metadata, path) if own_only else label_map_from_metadata(meta.metadata, path)
            same = next((i for i, m in enumerate(maps) if m == this), None)
            if this is not None and same is None:
                maps.append(this)
                same = len(maps) - 1
            parsed[raw] = -1 if same is None else same
        map_of.append(parsed[raw])
    return maps, map_of


def _label_keys(label_map: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    return sorted((c.get("label"), c.get("wnid"), c.get("name")) for c in label_map.get("classes", []))


@dataclass(frozen=True)
class ShardIndex:
    """Every row group of every shard, in order: `files[file_of[u]]`, row group `group_of[u]`, `rows[u]` rows.

    `starts[u]` is the global index of the first row of unit u; `starts[-1]` is the total row count.
    `spans[u]` is the (first, end) byte range of unit u's column chunks in its file (what read-ahead asks for).
    `footers[f]`: the SHA-256 of file f's footer as the index read it (local shards; empty for remote ones, whose
    footers the remote checks): `open_fd` / `open_file` refuse a file that is no longer that one.
    `generations[u]`: the generation of unit u's shard (format.shard_generation: 0 unless appended later);
    `label_maps`: the distinct label maps the shards carry (several once classes changed between generations: a
    format-2 overlay then gives the class list, `classes_for`)."""

    files: tuple[Path, ...]
    file_of: np.ndarray
    group_of: np.ndarray
    rows: np.ndarray
    starts: np.ndarray
    label_map: dict[str, Any]
    spans: np.ndarray
    footers: tuple[str, ...] = ()
    generations: np.ndarray | None = None
    label_maps: tuple[dict[str, Any], ...] = ()
    map_of: tuple[int, ...] = ()  # per file: its label map's position in `label_maps` (-1: it carries none)

    @classmethod
    def build(
        cls,
        files: Sequence[Path],
        label_map: dict[str, Any] | None = None,
        metadata: Sequence[pq.FileMetaData] | None = None,
    ) -> ShardIndex:
        """Read only the Parquet footers (no data pages). Shards may carry different label maps (generations
        appended after the classes changed: `classes_for` then needs a format-2 overlay); an explicit `label_map`
        must agree (same wnid and name per label) with the one the shards carry when they all carry the same.
        `metadata`: the footers, already parsed (remote shards), instead of reading them from `files`."""
        file_of, group_of, rows, spans, generations = [], [], [], [], []
        metadata, footers = (metadata, []) if metadata is not None else read_footers(files)
        maps, map_of = label_maps_of(files, metadata, label_map is not None)
        for i, meta in enumerate(metadata):
            generation = shard_generation(meta.metadata)
            for g in range(meta.num_row_groups):
                file_of.append(i)
                group_of.append(g)
                rows.append(meta.row_group(g).num_rows)
                spans.append(row_group_span(meta, g))
                generations.append(generation)
        found = maps[0] if maps else None
        if label_map is not None and len(maps) == 1 and _label_keys(label_map) != _label_keys(maps[0]):
            raise ValueError(
                f"label_map: expected the label map stored in {files[0]} (same wnid and name per "
                "label), found a different one; drop label_map= or pass the matching label_map.json"
            )
        rows_arr = np.asarray(rows, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(rows_arr)]).astype(np.int64)
        return cls(
            tuple(Path(p) for p in files),
            np.asarray(file_of, dtype=np.int64),
            np.asarray(group_of, dtype=np.int64),
            rows_arr,
            starts,
            label_map or found or {},
            np.asarray(spans, dtype=np.int64).reshape(-1, 2),
            tuple(footers),
            np.asarray(generations, dtype=np.int64),
            tuple(maps),
            tuple(map_of),
        )

    def classes_for(self, overlay: Overlay | None) -> dict[str, Any]:
        """The label map of the dataset these shards and `overlay` make: a format-2 overlay's (or view's) own,
        else the one every shard carries — shards with different label maps need a format-2 overlay."""
        if overlay is not None and overlay.label_map is not None:
            return overlay.label_map
        if len(self.label_maps) > 1:
            odd = next(f for f, m in zip(self.files, self.map_of, strict=True) if m > 0)
            has = "no overlay" if overlay is None else f"the format-1 overlay {overlay.path}"
            raise FormatError(
                f"{odd}: expected the same label map as {self.files[0]} (shards without an overlay that maps "
                f"their labels must share one), found another ({len(self.label_maps)} label maps: classes changed "
                f"between appended generations) and {has}; run `dvc repro` (the curate stage writes a format-2 overlay "
                "holding the current label map), or `dvc pull` the shards and data/overlay of one version together"
            )
        return self.label_map

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Global row index -> (unit, row within the unit's row group)."""
        unit = int(np.searchsorted(self.starts, index, side="right")) - 1
        return unit, index - int(self.starts[unit])

    def file_rows(self, file: int) -> int:
        """The rows of file `file`, as the index read them."""
        return int(self.rows[self.file_of == file].sum())

    def rows_per_file(self) -> list[int]:
        """The rows of every file, as the index read them."""
        counts = np.bincount(self.file_of, weights=self.rows, minlength=len(self.files)).astype(np.int64)
        return [int(n) for n in counts]

    def local_overlay(self, overlay: Any, split: str | None, whole: bool, view: str | None = None) -> Overlay | None:
        """The curation overlay of these local shards (`overlay` as the readers take it: "auto", a path, False),
        or view `view` (overlay.view_path), checked against the footers this index read; `whole`: the shards are a
        whole split (`whole_split`), so every shard the overlay lists must be there. What every local reader and
        `tables` apply."""
        files = list(self.files)
        first = pq.read_metadata(files[0]).metadata
        classes = len(self.label_map["classes"])
        found = overlay_path(files, split) if view is None else view_path(files, view, split)
        rows = self.rows_per_file()
        known = self.label_maps
        return resolve_overlay(
            overlay, files, split, rows, classes, first, found, self.footers, whole, view=view, known=known
        )

    def open_fd(self, file: int) -> tuple[int, pq.FileMetaData]:
        """An O_RDONLY descriptor of file `file` and its footer, read through that descriptor and checked to be the
        one the index was built from (`checked_footer`): one footer read per open, nothing per row."""
        path = self.files[file]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise _gone(path) from None
        try:
            return fd, self.checked_footer(file, lambda n, at: os.pread(fd, n, at), os.fstat(fd).st_size)
        except BaseException:
            os.close(fd)
            raise

    def open_file(self, file: int) -> pq.ParquetFile:
        """File `file` as a ParquetFile, its footer checked as `open_fd` checks it (through the same open file)."""
        path = self.files[file]
        try:
            handle = pa.OSFile(str(path))
        except FileNotFoundError:
            raise _gone(path) from None
        try:
            return pq.ParquetFile(handle, metadata=self.checked_footer(file, handle.read_at, handle.size()))
        except BaseException:
            handle.close()
            raise

    def read_columns(self, file: int, columns: Sequence[str]) -> pa.Table:
        """`columns` of all of file `file`, opened and checked as `open_file` does."""
        handle = self.open_file(file)
        try:
            return handle.read(columns=list(columns), use_threads=False)
        finally:
            handle.close(force=True)

    def checked_footer(self, file: int, read_at: Any, size: int) -> pq.FileMetaData:
        """The footer of an open file `file`, its SHA-256 and row count those the index recorded (when it did)."""
        path = self.files[file]
        tail = tail_at(read_at, size, path)
        meta = parse_footer(tail, path)
        if self.footers and (footer_digest(tail) != self.footers[file] or meta.num_rows != self.file_rows(file)):
            raise FormatError(
                f"{path}: expected the shard this dataset was built from ({self.file_rows(file)} rows, footer sha256 "
                f"{self.footers[file][:16]}…), found {meta.num_rows} rows and footer sha256 "
                f"{footer_digest(tail)[:16]}…; {STALE}"
            )
        return meta

    def locate_file(self, unit: int, index: int) -> tuple[int, int]:
        """Global row index (in `unit`) -> (file, row within the file)."""
        file = int(self.file_of[unit])
        first_unit = int(np.searchsorted(self.file_of, file, side="left"))
        return file, index - int(self.starts[first_unit])


class RowGroupReader:
    """Reads one row group's `columns` at a time, keeps the `cache_size` most recently used ones.

    Reads are single-threaded: DataLoader workers are the parallelism (Arrow's thread pool inside each worker
    measured ~3x slower per row group on a busy 2-core machine).

    Open files are per process and never pickled; after a fork (DataLoader worker) they are reopened."""

    def __init__(
        self,
        index: ShardIndex,
        columns: Sequence[str],
        cache_size: int = 4,
        max_open: int = 64,
        remote: RowGroupSource | None = None,
    ):
        if cache_size < 1:
            raise ValueError(f"cache_size: expected >= 1 row groups, found {cache_size}")
        self.index, self.remote = index, remote
        self.columns = list(columns)
        self.cache_size = cache_size
        self.max_open = max_open
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._files: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_files"], state["_cache"] = OrderedDict(), OrderedDict()
        return state

    @property
    def open_files(self) -> int:
        return len(self._files) if self._pid == os.getpid() else 0

    @property
    def cached_units(self) -> list[int]:
        return list(self._cache) if self._pid == os.getpid() else []

    def _file(self, i: int) -> pq.ParquetFile:
        handle = self._files.get(i)
        if handle is None:
            while len(self._files) >= self.max_open:
                self._files.popitem(last=False)[1].close(force=True)
            handle = self._files[i] = self.index.open_file(i)
        self._files.move_to_end(i)
        return handle

    def read(self, unit: int) -> pa.Table:
        """The row group `unit` (columns only), from the LRU cache when recent."""
        if self._pid != os.getpid():
            self._reset()
        table = self._cache.get(unit)
        if table is None:
            table = self._cache[unit] = self.read_uncached(unit)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(unit)
        return table

    def read_uncached(self, unit: int) -> pa.Table:
        """A row group read for a single pass (the iterable dataset): not kept in the cache."""
        file, group = int(self.index.file_of[unit]), int(self.index.group_of[unit])
        if self.remote is not None:
            return self.remote.read_row_group(file, group, self.columns)
        if self._pid != os.getpid():
            self._reset()
        return self._file(file).read_row_group(group, columns=self.columns, use_threads=False)

    def willneed(self, units: Sequence[int]) -> None:
        """Start reading `units` into the page cache (local shards; remote ones are fetched by whoever reads)."""
        if self.remote is None:
            for u in units:
                first, end = (int(x) for x in self.index.spans[u])
                willneed(self.index.files[int(self.index.file_of[u])], [(first, end - first)])

"""Shards read straight from a DVC remote: footers and row groups by range requests, through a bounded local
cache (cache.py) of checked bytes only.

`RemoteShards` is picklable (DataLoader workers rebuild their fsspec filesystem after a fork or spawn). The cache
(`cache_dir`, one directory per shard md5) holds:
  * `<md5>/footer`: the shard's Parquet footer (small; kept, so a second start reads no footer remotely), checked
    before it is kept (PAR1, its length, it parses, its byte index has a row per row, its row groups lie inside
    the object);
  * `<md5>/<group>`: a sparse file as long as the shard's row group `group` ends, holding that row group's bytes
    at their own offsets — so pyarrow (with the footer passed in) and the footer's byte index read it as if it
    were the shard, and disk use is the row group's bytes only. Checked before it is kept: every image's bytes
    (read through the footer's byte index, as map-style reads them) against the row group's `sha256` column —
    one check per row group fetched (`python -m benchmarks.bench_reader --verify-only` measures it against
    decoding), so what the cache holds, and what is read from it, was verified. A reply that fails the check is
    fetched again (Policy: bounded retries with backoff), then fails naming the URL.
Each process fetches only the row groups it reads; one that several processes want at once is fetched once."""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .cache import Cache
from .dvcremote import Remote, RemoteError, check_md5, fetch_listing, find_remote, list_shards, lock_out
from .fetch import Corrupt, Fetcher, Policy
from .format import HASH_ALGORITHM, FormatError, decode_image_index, read_indexed
from .overlay import OVERLAY_DIR, OVERLAY_LIMIT, VIEWS_DIR, check_view_name, footer_digest, missing_view
from .pieces import Pieces, coalesce, column_span, verify_rows
from .shards import row_group_span

TAIL_BYTES = 1 << 19  # first guess at the footer size: label maps + byte index, ~360 KiB for a 1000-class 256 MB shard
FETCH_THREADS = 16
COALESCE_GAP = 1024  # sparse reads: kept images at most this many bytes apart are fetched in one range request
PIECE_COLUMNS = (HASH_ALGORITHM, "label")  # the column chunks a piece of some rows holds beside their images
HASHES_KEPT = 256  # row groups whose sha256 chunk a process keeps parsed (32-byte digests as hex: ~7 KB each)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imagenet-parquet"


def open_dvc(
    repo: Path,
    path: str,
    rev: str | None,
    remote: str | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_bytes: int,
    policy: Policy | None = None,
    view: str | None = None,
) -> RemoteShards:
    """The RemoteShards of DVC-tracked `path` in checkout `repo` (see ParquetIterableDataset.from_dvc): with the
    version's curation overlay, or the file of view `view` instead."""
    out, md5 = lock_out(repo, path, rev)
    fetcher = Fetcher(find_remote(repo, rev, remote), policy or Policy())
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    cache = Cache(root, cache_bytes)  # the listings are kept too: a restart asks the remote for nothing
    entries = list_shards(fetcher, out, md5, path, cache)
    if view is None:
        overlay = _overlay_entry(fetcher, cache, repo, out, path, rev)
    else:
        overlay = _view_entry(fetcher, cache, repo, out, path, rev, view)
    shards = RemoteShards(fetcher.remote, entries, root, cache_bytes, fetcher.policy, overlay)
    shards.view = view
    return shards


def _overlay_entry(
    fetcher: Fetcher, cache: Cache, repo: Path, out: str, path: str, rev: str | None
) -> tuple[str, str] | None:
    """(path, md5) of the curation overlay of the split `path` names, as this version's dvc.lock and listing vouch
    for it; None for a version without one (before the curate stage)."""
    sub = PurePosixPath(path).relative_to(out).parts
    if not sub:
        return None
    target = PurePosixPath(out).parent / OVERLAY_DIR / f"{sub[0]}.parquet"
    try:
        overlay_out, md5 = lock_out(repo, str(target), rev)
    except RemoteError:
        return None
    found = dict(list_shards(fetcher, overlay_out, md5, str(target.parent), cache))
    return (str(target), found[target.name]) if target.name in found else None


def _view_entry(
    fetcher: Fetcher, cache: Cache, repo: Path, out: str, path: str, rev: str | None, view: str
) -> tuple[str, str]:
    """(path, md5) of view `view`'s file for the split `path` names (`<out>/../views/<view>/<split>.parquet`), as
    this version's dvc.lock and listing vouch for it; a view that is not there: an error listing those that are."""
    sub = PurePosixPath(path).relative_to(out).parts
    if not sub:
        raise ValueError(f"view: expected a split (data/parquet/<split>, or split=) to read view {view!r} of")
    target = PurePosixPath(out).parent / VIEWS_DIR / check_view_name(view) / f"{sub[0]}.parquet"
    try:
        views_out, md5 = lock_out(repo, str(target), rev)
    except RemoteError:
        raise missing_view(f"{repo}/dvc.lock", view, []) from None
    entries: dict[str, str] = {}
    if md5.endswith(".dir"):
        try:
            entries = {str(e["relpath"]): str(e["md5"]) for e in json.loads(fetch_listing(fetcher, md5, cache))}
        except (ValueError, TypeError, KeyError) as err:
            raise RemoteError(f"{views_out} ({md5}): expected a JSON list of {{md5, relpath}}, found: {err}") from None
    elif PurePosixPath(views_out) == target:
        entries = {target.name: md5}
    rel = str(target.relative_to(views_out)) if PurePosixPath(views_out) != target else target.name
    if rel not in entries:
        present = sorted({r.split("/")[0] for r in entries if r.endswith(f"/{target.name}")})
        raise missing_view(f"{views_out} in dvc.lock", view, present)
    return str(target), entries[rel]


class RemoteShards:
    """The shard files [(name, md5)] of one version in `remote`, read by range requests through `cache_dir`."""

    def __init__(
        self,
        remote: Remote,
        entries: Sequence[tuple[str, str]],
        cache_dir: Path,
        cache_bytes: int,
        policy: Policy | None = None,
        overlay: tuple[str, str] | None = None,
    ):
        if not entries:
            raise RemoteError(f"{remote.shown(remote.url)}: expected *.parquet shards in the listing, found none")
        if cache_bytes <= 0:
            raise ValueError(f"cache_limit: expected > 0 bytes, found {cache_bytes}")
        self.remote, self.entries = remote, [(n, check_md5(m, remote.shown(remote.url), n)) for n, m in entries]
        self.cache_dir, self.cache_bytes = Path(cache_dir), int(cache_bytes)
        self.overlay = (
            None if overlay is None else (overlay[0], check_md5(overlay[1], remote.shown(remote.url), overlay[0]))
        )
        self.fetcher, self.cache = Fetcher(remote, policy or Policy()), Cache(self.cache_dir, self.cache_bytes)
        self.view: str | None = None  # the view whose file `overlay` is (open_dvc), else the curation overlay's
        self._reset()

    def _reset(self) -> None:
        self._meta: dict[int, pq.FileMetaData] = {}
        self._digests: dict[int, str] = {}  # per file: the SHA-256 of its footer (what the overlay vouches for)
        self._index: dict[int, np.ndarray | None] = {}  # per file: the footer's byte index, decoded once
        self._starts: dict[int, np.ndarray] = {}  # per file: the first row of each row group
        self._process()

    def _process(self) -> None:
        """This process's own state: never pickled, dropped after a fork."""
        self._pid = os.getpid()
        self._readers: dict[int, Pieces] = {}
        self._hashes: OrderedDict[tuple[int, int], list[str]] = OrderedDict()  # (file, group) -> its sha256 column
        self._names: dict[tuple[int, tuple[int, ...]], str] = {}  # sparse pieces' names (_rows_name)
        self._chunks: OrderedDict[tuple[int, tuple[int, int]], bytes] = OrderedDict()  # (file, span): _remember

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_readers", "_hashes", "_names", "_chunks")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._process()

    @property
    def names(self) -> list[Path]:
        return [Path(name) for name, _ in self.entries]

    def _url(self, file: int) -> str:
        return self.remote.object_urls(self.entries[file][1])[0]

    # ------------------------------------------------------------ footers
    def metadata(self) -> list[pq.FileMetaData]:
        """Every shard's footer: from the cache, else fetched (in parallel, a range request or two each)."""
        with ThreadPoolExecutor(FETCH_THREADS) as pool:
            return list(pool.map(self.footer, range(len(self.entries))))

    def footer(self, file: int) -> pq.FileMetaData:
        meta = self._meta.get(file)
        if meta is None:
            fd = self.cache.open_or_fill(self.entries[file][1], "footer", lambda fd: self._fill_footer(file, fd))
            try:
                data = os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                self.cache.close(fd)
            meta = self._meta[file] = pq.read_metadata(pa.BufferReader(data))
            self._digests[file] = footer_digest(data[4:])
        return meta

    def footer_digests(self) -> list[str]:
        """The SHA-256 of every shard's footer as fetched (the overlay names the one each shard must have)."""
        self.metadata()
        return [self._digests[f] for f in range(len(self.entries))]

    def overlay_file(self) -> Path | None:
        """The version's curation overlay in the local cache (fetched whole, checked against the md5 its listing
        gives it before it is kept), or None when the version has none."""
        if self.overlay is None:
            return None
        name, md5 = self.overlay
        self.cache.close(self.cache.open_or_fill(md5, "overlay", lambda fd: self._fill_overlay(name, md5, fd)))
        path = self.cache_dir / md5 / "overlay"
        if not path.is_file():
            raise RemoteError(
                f"{self.cache_dir}: expected room for the curation overlay {name} in the cache, found none within "
                f"cache_limit={self.cache_bytes} bytes; pass a larger cache_limit"
            )
        return path

    def _fill_overlay(self, name: str, md5: str, fd: int) -> None:
        url = self.remote.object_urls(md5)[0]
        size = self.fetcher.size(url)
        if size > OVERLAY_LIMIT:
            raise RemoteError(f"{self.remote.shown(url)}: expected a curation overlay, found {size} bytes")

        def attempt() -> bytes:
            data = self.fetcher.read(url, 0, size)
            if hashlib.md5(data).hexdigest() != md5:
                raise Corrupt(f"expected the overlay {name} to have md5 {md5} (the listing), found other bytes")
            return data

        self.cache.write(fd, self.fetcher.retry(url, f"the overlay {name}", attempt), 0)

    def _fill_footer(self, file: int, fd: int) -> None:
        url = self._url(file)
        try:
            size = self.fetcher.size(url)
            data = self.fetcher.retry(url, "the footer", lambda: self._footer_bytes(file, url, size))
        except FileNotFoundError:
            raise RemoteError(
                f"{self.remote.shown(url)}: expected shard {self.entries[file][0]} in the remote, found none; "
                "run `dvc push` in the project"
            ) from None
        self.cache.write(fd, data, 0)

    def _footer_bytes(self, file: int, url: str, size: int) -> bytes:
        """`PAR1` + the footer of the object (`size` bytes), checked; Corrupt when it is not a sound one."""
        tail = self.fetcher.read(url, max(0, size - TAIL_BYTES), size)
        length = int.from_bytes(tail[-8:-4], "little")
        if tail[-4:] != b"PAR1" or length + 12 > size:
            raise Corrupt("expected a Parquet file (ends with PAR1 after the footer's length), found other bytes")
        if length + 8 > len(tail):
            tail = self.fetcher.read(url, size - length - 8, size)
        data = b"PAR1" + tail[-(length + 8) :]
        try:
            meta = pq.read_metadata(pa.BufferReader(data))
            decode_image_index(meta.metadata, meta.num_rows, self.entries[file][0])
            spans = [row_group_span(meta, g) for g in range(meta.num_row_groups)]
        except (OSError, ValueError, pa.ArrowException) as err:
            raise Corrupt(f"expected a Parquet footer, found one that does not parse ({err})") from None
        if any(end > size - length - 8 for _, end in spans):
            raise Corrupt("expected a footer whose row groups lie inside the object, found one beyond it")
        if HASH_ALGORITHM not in meta.schema.names:
            raise RemoteError(
                f"{self.remote.shown(url)}: expected a {HASH_ALGORITHM} column to check the images against (the "
                f"convert stage writes one), found {meta.schema.names}; read such shards after `dvc pull`"
            )
        return data

    # ------------------------------------------------------------ row groups
    def _piece(self, file: int, group: int) -> int:
        """A descriptor of the local sparse file holding row group `group` of `file` (verified), fetched if needed
        (one range request; by one process when several want it)."""

        def size() -> int:
            first, end = row_group_span(self.footer(file), group)
            return end - first

        fill = lambda fd: self._fill_group(file, group, fd)  # noqa: E731
        return self.cache.open_or_fill(self.entries[file][1], str(group), fill, size)

    def _fill_group(self, file: int, group: int, fd: int) -> None:
        first, end = row_group_span(self.footer(file), group)
        url = self._url(file)

        def attempt() -> None:
            data = self.fetcher.read(url, first, end)
            self.cache.write(fd, data, first)
            self._pieces(file).verify(fd, group, data, first)

        try:
            self.fetcher.retry(url, f"row group {group} (bytes {first}-{end})", attempt)
        except FileNotFoundError:
            raise RemoteError(f"{self.remote.shown(url)}: expected shard object, found none; run `dvc push`") from None
        except RemoteError:  # the footer may be the bad part (it has no hash of its own): the next start refetches it
            (self.cache_dir / self.entries[file][1] / "footer").unlink(missing_ok=True)
            raise

    def _pieces(self, file: int) -> Pieces:
        """This process's reader of `file`'s pieces (one ParquetFile per shard: its footer parsed once)."""
        if self._pid != os.getpid():
            self._pid, self._readers = os.getpid(), {}
        reader = self._readers.get(file)
        if reader is None:
            reader = Pieces(self.footer(file), self._byte_index(file), self.entries[file][0])
            reader = self._readers.setdefault(file, reader)
        return reader

    def read_labels(self, file: int, group: int, kept: Sequence[int] | None = None, keep: bool = True) -> np.ndarray:
        """The `label` column of row group `group` of `file`, from its piece (or, given `kept`, the piece of those
        rows: it holds the group's label chunk too; `keep` as read_image's)."""
        fd = self._piece(file, group) if kept is None else self._rows_piece(file, group, tuple(kept), keep)
        try:
            labels: np.ndarray = self._pieces(file).read_row_group(fd, group, ["label"]).column(0).to_numpy()
            return labels
        finally:
            self.cache.close(fd)

    def read_row_group(self, file: int, group: int, columns: Sequence[str]) -> pa.Table:
        fd = self._piece(file, group)
        try:
            return self._pieces(file).read_row_group(fd, group, columns)
        finally:
            self.cache.close(fd)

    def read_image(
        self, file: int, group: int, row: int, kept: Sequence[int] | None = None, keep: bool = True
    ) -> bytes | None:
        """Image `row` of `file` (in row group `group`) through the footer's byte index (map-style), the row group
        fetched into the cache first — or, given `kept` (the file rows of the group the reader keeps, `row` among
        them), those rows' images only (`_rows_piece`); None for a shard without the index (the caller reads the
        row group). Every image read from the cache is checked against its row's sha256 (the piece's own chunk,
        parsed once per process): a cached byte changed since it was fetched is refused, the piece deleted and
        fetched again. `keep` False: the piece of `kept` is fetched into memory, read once, never cached (a node
        whose live row groups do not fit its cache)."""
        index = self._byte_index(file)
        if index is None:
            return None
        for _ in range(2):  # the cached piece, then (when it fails its check) the piece fetched again
            fd = self._piece(file, group) if kept is None else self._rows_piece(file, group, tuple(kept), keep)
            try:
                data = read_indexed(fd, index[row], self.entries[file][0])
                if self._digest(fd, file, group, row) == hashlib.sha256(data).hexdigest():
                    return data
            except (FormatError, Corrupt):
                pass
            finally:
                self.cache.close(fd)
            if keep:
                self._drop_piece(file, group, kept)
        raise RemoteError(
            f"{self.remote.shown(self._url(file))}: image {row} of {self.entries[file][0]} read from the cache "
            f"({self.cache_dir}) does not match its {HASH_ALGORITHM}, also when fetched again; check the disk of the "
            "cache and the remote"
        )

    def _digest(self, fd: int, file: int, group: int, row: int) -> str:
        """The sha256 of file row `row` as the piece open at `fd` records it (its row group's chunk, kept per
        process for the 256 row groups read last)."""
        key = (file, group)
        if self._pid != os.getpid():
            self._process()
        hashes = self._hashes.get(key)
        if hashes is None:
            try:
                table = self._pieces(file).read_row_group(fd, group, [HASH_ALGORITHM])
            except (OSError, ValueError, pa.ArrowException) as err:
                raise Corrupt(f"the {HASH_ALGORITHM} chunk of row group {group} does not parse ({err})") from None
            hashes = self._hashes[key] = table.column(0).to_pylist()
            while len(self._hashes) > HASHES_KEPT:
                self._hashes.popitem(last=False)
        self._hashes.move_to_end(key)
        first = int(self._group_starts(file)[group])
        return str(hashes[row - first])

    def _group_starts(self, file: int) -> np.ndarray:
        """The first file row of each row group of `file`."""
        starts = self._starts.get(file)
        if starts is None:
            meta = self.footer(file)
            rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            starts = self._starts[file] = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        return starts

    def _drop_piece(self, file: int, group: int, kept: Sequence[int] | None) -> None:
        """Delete the cached piece (it failed its check on read) and what this process parsed of it."""
        self._hashes.pop((file, group), None)
        name = str(group) if kept is None else self._rows_name(group, tuple(kept))
        (self.cache_dir / self.entries[file][1] / name).unlink(missing_ok=True)

    def prefetch(self, file: int, group: int, kept: Sequence[int] | None = None) -> None:
        """Row group `group` of `file` (or the kept rows' images of it) into the cache, as `read_image` would."""
        if self._byte_index(file) is None:
            self.cache.close(self._piece(file, group))
        else:
            fd = self._piece(file, group) if kept is None else self._rows_piece(file, group, tuple(kept))
            self.cache.close(fd)

    def _rows_piece(self, file: int, group: int, kept: tuple[int, ...], keep: bool = True) -> int:
        """A descriptor of the local sparse file holding the images of file rows `kept` of row group `group` and the
        group's sha256 chunk, at their own offsets (verified), fetched if needed: a few range requests (adjacent
        images in one), so a view keeping few rows reads about their bytes, not the row group's. `keep` False: in
        memory, not cached."""

        def size() -> int:
            meta, index = self.footer(file), self._byte_index(file)
            assert index is not None
            chunks = sum(end - first for first, end in (column_span(meta, group, name) for name in PIECE_COLUMNS))
            return chunks + int(index[list(kept), 1].sum()) + 4 * len(kept)

        fill = lambda fd: self._fill_rows(file, group, kept, fd)  # noqa: E731
        if not keep:
            return self.cache.fill_memory(fill)
        return self.cache.open_or_fill(self.entries[file][1], self._rows_name(group, kept), fill, size)

    def _remember(self, file: int, fd: int, chunks: list[tuple[int, int]]) -> None:
        """Keep a checked piece's small column chunks (a few KB), so the next piece of some rows of the same group
        this process fills needs only its images' bytes (a cache under pressure fetches rows alone)."""
        for first, end in chunks:
            self._chunks[file, (first, end)] = os.pread(fd, end - first, first)
            self._chunks.move_to_end((file, (first, end)))
        while len(self._chunks) > 2 * HASHES_KEPT:
            self._chunks.popitem(last=False)

    def _rows_name(self, group: int, kept: tuple[int, ...]) -> str:
        """`<group>-<16 hex digits>`: the digest of the rows (and of what a piece of them holds: PIECE_COLUMNS),
        kept per process (a tuple's hash finds it: the readers pass the same tuple object for a row group)."""
        name = self._names.get((group, kept))
        if name is None:
            key = ",".join(PIECE_COLUMNS).encode() + np.asarray(kept, dtype="<i8").tobytes()
            name = self._names[group, kept] = f"{group}-{hashlib.sha256(key).hexdigest()[:16]}"
        return name

    def _fill_rows(self, file: int, group: int, kept: tuple[int, ...], fd: int) -> None:
        meta, index, url = self.footer(file), self._byte_index(file), self._url(file)
        assert index is not None
        images = [(int(offset) - 4, int(offset) + int(size)) for offset, size in index[list(kept)]]
        chunks = [column_span(meta, group, name) for name in PIECE_COLUMNS]

        def fetch(span: tuple[int, int]) -> None:
            self.cache.write(fd, self.fetcher.read(url, *span), span[0])

        def attempt() -> None:
            known = {c: self._chunks[file, c] for c in chunks if (file, c) in self._chunks}
            for (first, _), data in known.items():  # this process fetched them for another piece of the group
                self.cache.write(fd, data, first)
            ranges = coalesce([*(c for c in chunks if c not in known), *images], COALESCE_GAP)
            with ThreadPoolExecutor(min(FETCH_THREADS, len(ranges))) as pool:  # a few ranges: in parallel
                list(pool.map(fetch, ranges))
            try:
                verify_rows(self._pieces(file), fd, group, kept)
            except Corrupt:
                for c in chunks:
                    self._chunks.pop((file, c), None)
                raise
            self._remember(file, fd, chunks)

        try:
            self.fetcher.retry(url, f"{len(kept)} images of row group {group}", attempt)
        except FileNotFoundError:
            raise RemoteError(f"{self.remote.shown(url)}: expected shard object, found none; run `dvc push`") from None
        except RemoteError:  # as for a whole row group: the footer (its byte index) may be the bad part
            (self.cache_dir / self.entries[file][1] / "footer").unlink(missing_ok=True)
            raise

    def _byte_index(self, file: int) -> np.ndarray | None:
        if file not in self._index:
            meta = self.footer(file)
            self._index[file] = decode_image_index(meta.metadata, meta.num_rows, self.entries[file][0])
        return self._index[file]

    def read_columns(self, file: int, columns: Sequence[str]) -> pa.Table:
        """Small `columns` (e.g. `label`) of the whole of `file`, straight from the remote: only their column
        chunks are requested (uncached reads: a range request each), never the image bytes of the row groups."""
        meta, url = self.footer(file), self._url(file)

        def attempt() -> pa.Table:
            with self.fetcher.fs.open(url, "rb", cache_type="none") as fh:
                return pq.ParquetFile(fh, metadata=meta).read(columns=list(columns), use_threads=False)

        return self.fetcher.retry(url, f"columns {list(columns)}", attempt)

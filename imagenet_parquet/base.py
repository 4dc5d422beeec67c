"""What both datasets share (`ShardedImages`): the shard index, the label map, the curation overlay, reading one
row (local byte index, remote cache, or row group) with its checks, decoding and transforms."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from .decode import ImageDecodeError, Size, decode_image
from .format import HASH_ALGORITHM, class_ids, read_label_map
from .heap import release_freed_heap
from .indexed import IndexedReader, check_image, checked_label
from .overlay import Overlay, resolve_overlay
from .shards import RowGroupReader, ShardIndex, Source, find_shards, whole_split

if TYPE_CHECKING:
    from .remote import RemoteShards

READ_COLUMNS = ("image.bytes", "label")
SPARSE_SHARE = 0.5  # remote: a row group of which the overlay keeps at most this share is fetched row by row


def _worker() -> tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker; (0, 1) in the main process."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class ShardedImages:
    """What both datasets share: shard index, label map, decoding and transforms."""

    def __init__(
        self,
        source: Source | RemoteShards,
        split: str | None,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[int], Any] | None,
        draft_size: Size | None,
        decode: bool,
        label_map: Any,
        cache_row_groups: int,
        overlay: Any = "auto",
        verify: bool = False,
        crop: Callable[[bytes], Any] | None = None,
        view: str | None = None,
    ):
        explicit = read_label_map(label_map) if isinstance(label_map, (str, os.PathLike)) else label_map
        from .remote import RemoteShards

        self.remote: RemoteShards | None = None
        if isinstance(source, RemoteShards):
            self.remote, self.files = source, source.names
            self.index = ShardIndex.build(self.files, explicit, metadata=source.metadata())
        else:
            self.files = find_shards(source, split)
            self.index = ShardIndex.build(self.files, explicit)
            self._whole = whole_split(source, split)  # a split read whole: its overlay's shards must all be there
        self.transform = transform
        self.target_transform = target_transform
        self.draft_size = draft_size
        self.decode = decode
        self.crop = crop
        self.view = view
        self.overlay = self._overlay(overlay, split, view)
        self._classes = self.index.classes_for(self.overlay)  # a format-2 overlay's (or view's) own label map
        self._kept = None if self.overlay is None else self.overlay.kept
        self._num_classes = len(self._classes["classes"])
        self._sparse_rows: dict[int, tuple[int, ...] | None] = {}
        self._node_rows: dict[int, tuple[int, ...]] = {}  # row groups this node reads part of (datasets.py)
        self._pressure = False  # the node's live row groups do not fit its cache: fetch rows alone (datasets.py)
        self.verify = verify and self.remote is None  # remote row groups are always checked before they are cached
        columns = [*READ_COLUMNS, *([HASH_ALGORITHM] if self.verify else [])]
        self._reader = RowGroupReader(self.index, columns, cache_size=cache_row_groups, remote=self.remote)
        labels = self.overlay is None  # else the overlay holds them; files checked against the index when opened
        self._indexed = IndexedReader(
            self.files, num_classes=len(self.label_names), labels=labels, verify=self.verify, index=self.index
        )
        self._labels: dict[int, np.ndarray] = {}
        release_freed_heap()  # before a DataLoader forks its workers

    def _overlay(self, overlay: Any, split: str | None, view: str | None) -> Overlay | None:
        """The curation overlay (overlay.py): found beside the shards (or fetched with a remote version) by default;
        view `view` instead of it when named."""
        if self.remote is None:  # checked against the footers the index read; each reader checks again on open
            return self.index.local_overlay(overlay, split, self._whole, view)
        if view != self.remote.view:
            raise ValueError(
                f"view: expected the view the remote shards were opened with ({self.remote.view!r}), found {view!r}; "
                "pass view= to from_dvc"
            )
        first = self.remote.footer(0).metadata
        found, footers = self.remote.overlay_file(), self.remote.footer_digests()
        rows, classes = self.index.rows_per_file(), len(self.index.label_map["classes"])
        known = self.index.label_maps
        return resolve_overlay(overlay, self.files, split, rows, classes, first, found, footers, view=view, known=known)

    @property
    def num_images(self) -> int:
        """The images this dataset yields: the shards' rows, less those the curation overlay excludes."""
        return len(self.index) if self._kept is None else len(self._kept)

    def _global(self, index: int) -> int:
        """Dataset index -> the global row of the shards (the same without an overlay)."""
        return index if self._kept is None else int(self._kept[index])

    @classmethod
    def from_dvc(
        cls,
        repo: str | os.PathLike[str],
        path: str,
        rev: str | None = None,
        remote: str | None = None,
        *,
        split: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_gb: float | None = None,
        cache_limit: str | int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        object_timeout: float = 45.0,
        retries: int = 3,
        retry_backoff: float = 0.5,
        view: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """The shards of DVC-tracked `path` ("data/parquet/train", or "data/parquet" with `split`) in checkout
        `repo` (at git `rev`), read straight from the DVC remote — no `dvc pull`, no DVC install
        (`pip install 'imagenet-parquet[remote]'`).

        `remote`: a remote name from .dvc/config (default: core.remote) or a URL (s3://, http(s)://, a directory).
        S3 credentials come from the environment as for any boto client; HTTP ones from the remote's DVC options
        (`auth`, `user`, `password`, `custom_auth_header`; secrets in .dvc/config.local) or
        IMAGENET_PARQUET_HTTP_USER / IMAGENET_PARQUET_HTTP_PASSWORD. Row groups are fetched by range requests
        when first read, by the process that reads them, checked against their sha256 column, into a local cache
        of at most `cache_limit` ("200GB", "1.5TB", "500GiB" or bytes; or `cache_gb`; default 20 GB) at any moment
        (`cache_dir`, default ~/.cache/imagenet-parquet): one per node, shared by its ranks and workers, every image
        checked again when read from it. Every request: `connect_timeout`,
        `read_timeout` (seconds without a byte), `retries` with exponential backoff from `retry_backoff` seconds,
        all within `object_timeout` seconds per object (the defaults make a stalled server an error within a
        minute). `view`: a named view (data/views/<view>/<split>.parquet, fetched and checked as the overlay is)
        instead of the whole curated dataset; only its rows' image bytes are fetched where it keeps few of a row
        group's. `kwargs` go to the dataset (transform, seed, ...)."""
        from .cache import parse_size
        from .fetch import Policy
        from .remote import open_dvc

        if cache_gb is not None and cache_limit is not None:
            raise ValueError(f"cache_gb, cache_limit: expected one of them, found both ({cache_gb}, {cache_limit!r})")
        if cache_limit is not None:
            limit = parse_size(cache_limit)
        else:
            limit = parse_size((20.0 if cache_gb is None else cache_gb) * 1e9, "cache_gb")
        policy = Policy(connect_timeout, read_timeout, object_timeout, retries, retry_backoff)
        target = f"{path.rstrip('/')}/{split}" if split else path
        shards = open_dvc(Path(repo), target, rev, remote, cache_dir, limit, policy, view)
        return cls(shards, view=view, **kwargs)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self.files)} shards from {self.files[0].parent}, "
            f"{self.num_images} images, {len(self.index.rows)} row groups, {len(self.label_names)} classes"
            f"{f', view {self.view}' if self.view else ', curation overlay applied' if self.overlay else ''})"
        )

    @property
    def label_map(self) -> dict[str, Any]:
        """The label map (docs/CONTRACTS.md: num_classes, label_source, classes[label, wnid, name, ...]): a
        format-2 overlay's or a view's own when it has one (the view's classes, labels 0..K-1), else the shards'."""
        return self._classes

    @property
    def label_names(self) -> list[str]:
        """Human-readable class names by label (`label_name` column, HF ClassLabel names)."""
        return [c["name"] for c in sorted(self.label_map["classes"], key=lambda c: c["label"])]

    @property
    def classes(self) -> list[str]:
        """The class folder names by label, as torchvision's ImageFolder gives `classes`: the WordNet ids of an
        ImageNet-style dataset, the folder names of any other (docs/CONTRACTS.md)."""
        return class_ids(self.label_map)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def _read_row(self, index: int) -> tuple[bytes, int]:
        """(image bytes, label) of global row `index`: one pread through the footer's byte index (local shards),
        the row group fetched into the local cache (remote), or the cached row group (shards without the index)."""
        unit, row = self.index.locate(index)
        hit: tuple[bytes, int] | None
        if self.remote is not None:
            file, file_row = self.index.locate_file(unit, index)
            kept, keep = self._fetch_rows(unit, file_row)
            image = self.remote.read_image(file, int(self.index.group_of[unit]), file_row, kept, keep)
            label = -1 if image is None or self.overlay is not None else self._remote_labels(unit, kept, keep)[row]
            hit = None if image is None else (image, label)
        else:
            hit = self._indexed.read(*self.index.locate_file(unit, index))
        if hit is None:
            table = self._reader.read(unit)
            hit = table.column("image")[row]["bytes"].as_py(), table.column("label")[row].as_py()
            if self.verify:
                file, file_row = self.index.locate_file(unit, index)
                check_image(hit[0], table.column(HASH_ALGORITHM)[row].as_py(), self.files[file], file_row)
        if self.overlay is not None:
            return hit[0], int(self.overlay.labels[index])
        return hit[0], checked_label(hit[1], self._num_classes, self.files[self.index.locate_file(unit, index)[0]])

    def _fetch_rows(self, unit: int, file_row: int) -> tuple[tuple[int, ...] | None, bool]:
        """(the file rows to fetch with file row `file_row` of row group `unit`, whether to cache them) (remote):
        `_sparse`'s, cached — or, when the node's live row groups do not fit its cache (`_pressure`: whole groups
        would be evicted before their rows are read, and fetched again for each), that row alone, read from memory
        once."""
        kept = self._sparse(unit)
        return ((file_row,), False) if kept is None and self._pressure else (kept, True)

    def _sparse(self, unit: int) -> tuple[int, ...] | None:
        """The file rows of row group `unit` to fetch alone (remote: only their image bytes): this node's rows of a
        row group it shares with another node (at a canonical partition's bound), or the rows the overlay keeps
        when they are at most SPARSE_SHARE of it; None: the whole row group (most of it is read anyway)."""
        if unit in self._node_rows:
            return self._node_rows[unit]
        if self.overlay is None:
            return None
        if unit not in self._sparse_rows:
            first, end = int(self.index.starts[unit]), int(self.index.starts[unit + 1])
            kept = np.flatnonzero(self.overlay.keep[first:end])
            offset = self.index.locate_file(unit, first)[1]
            sparse = len(kept) <= SPARSE_SHARE * (end - first)
            self._sparse_rows[unit] = tuple((kept + offset).tolist()) if sparse else None
        return self._sparse_rows[unit]

    def _remote_labels(self, unit: int, kept: tuple[int, ...] | None, keep: bool) -> np.ndarray:
        """Labels of row group `unit` of remote shards (the piece `kept` names holds the group's label chunk; kept
        here: 8 bytes a row)."""
        labels = self._labels.get(unit)
        if labels is None:
            assert self.remote is not None
            file, group = int(self.index.file_of[unit]), int(self.index.group_of[unit])
            labels = self._labels[unit] = self.remote.read_labels(file, group, kept, keep)
        return labels

    def _share_rows(self, rows: np.ndarray) -> None:
        """This node reads global rows `rows` this epoch: the row groups it reads only part of (a canonical
        partition's bound cuts them; another node reads the rest) are fetched as those rows alone (`_sparse`)."""
        rows = np.sort(rows)
        units = np.searchsorted(self.index.starts, rows, side="right") - 1
        read = np.bincount(units, minlength=len(self.index.rows))
        if self.overlay is None:
            whole = self.index.rows
        else:
            kept_units = np.searchsorted(self.index.starts, np.flatnonzero(self.overlay.keep), side="right") - 1
            whole = np.bincount(kept_units, minlength=len(self.index.rows))
        self._node_rows = {}
        for unit in np.flatnonzero((read > 0) & (read < whole)).tolist():
            mine = rows[units == unit]
            offset = self.index.locate_file(unit, int(self.index.starts[unit]))[1] - int(self.index.starts[unit])
            self._node_rows[unit] = tuple((mine + offset).tolist())

    def _prefetch(self, unit: int) -> None:
        """Row group `unit` (or the rows of it the overlay keeps) into the remote's node cache (predownload)."""
        assert self.remote is not None
        self.remote.prefetch(int(self.index.file_of[unit]), int(self.index.group_of[unit]), self._sparse(unit))

    def _undecodable(self, index: int, err: Exception) -> ImageDecodeError:
        """The error for global row `index`, whose image no decoder decoded (`err`: the decoder's own)."""
        file, row = self.index.locate_file(self.index.locate(index)[0], index)
        return ImageDecodeError(
            f"{self.files[file]}: row {row}: expected an image the decoders read, found bytes they refuse "
            f"({type(err).__name__}: {err}); exclude the image (curation/exclude.csv) or re-convert its source "
            "with `convert.full_decode: true` (undecodable images are then quarantined, never stored)"
        )

    def _willneed(self, indices: list[int]) -> None:
        """Ask the kernel for these rows' images (POSIX_FADV_WILLNEED; local shards with the byte index)."""
        if self.remote is None:
            self._indexed.willneed([self.index.locate_file(self.index.locate(i)[0], i) for i in indices])

    def _sample(self, data: bytes, label: int, index: int) -> tuple[Any, Any]:
        image: Any = data
        if self.decode:
            try:
                image = self.crop(data) if self.crop is not None else decode_image(data, draft_size=self.draft_size)
            except Exception as err:  # Pillow's OSError, its bomb error, a decoder's ValueError: one error naming it
                raise self._undecodable(index, err) from err
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

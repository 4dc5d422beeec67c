"""The curation overlay (merge-on-read): the labels and the keep flag of every row of a split's shards, kept
beside the shards so that curation never rewrites them (docs/CONTRACTS.md, "Curation overlay").

`<parquet root>/../overlay/<split>.parquet` (the curate stage writes it; `overlay_path`): one row per shard row,
shards in name order and rows in file order — columns `shard` (the shard's file name), `row` (its row in that
file), `label` (the label now) and `keep` (false: excluded). Its footer key `imagenet_parquet.overlay` (JSON)
names every shard it was made for with its row count and the SHA-256 of its Parquet footer (so a shard changed,
swapped or with an altered footer is refused), and the SHA-256 of its own content (labels, keep flags, shard
list): a damaged overlay is refused too. Readers take every label from it and skip the rows it excludes.

Shards of format >= 6 say they are curated by an overlay (`curation: overlay` in their metadata): read without
one they would give the labels as converted, so a reader that finds none refuses them (overlay=False reads them
as converted, on purpose)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import CLASS_FIELDS, FormatError, class_names, own_metadata

OVERLAY_KEY = b"imagenet_parquet.overlay"
OVERLAY_FORMAT = 1
LABEL_MAP_FORMAT = 2  # an overlay (or view) that carries its own `label_map`: the labels it gives follow that map
OVERLAY_FORMATS = (OVERLAY_FORMAT, LABEL_MAP_FORMAT)  # what readers accept
OVERLAY_DIR = "overlay"  # beside the Parquet root: data/parquet -> data/overlay
VIEWS_DIR = "views"  # beside the Parquet root: data/parquet -> data/views/<name>/<split>.parquet
VIEW_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
EXCLUDED_LABEL = -1  # format 2: the label of an excluded row whose class the label map no longer has
OVERLAY_SCHEMA = pa.schema([("shard", pa.string()), ("row", pa.int32()), ("label", pa.int64()), ("keep", pa.bool_())])
OVERLAY_LIMIT = 1 << 30  # an overlay larger than this is not one (ImageNet-1k: ~2 MB; 13 M rows: ~25 MB)
CURATED_BY_OVERLAY = "overlay"  # a shard's `curation` metadata: labels and membership come from the overlay
CURATION_APPLIED = "applied"  # a compacted shard's: the labels stored are the curated ones (no overlay applies)
HELP = "run `dvc repro` (or `dvc pull` the shards and data/overlay of one version together)"


class OverlayError(FormatError):
    """An overlay that does not belong to the shards, or is damaged; the message says what to do."""


def overlay_path(files: Sequence[str | os.PathLike[str]], split: str | None = None) -> Path:
    """Where the overlay of shards `files` (in `<root>/<split>/`) lives: `<root>/../overlay/<split>.parquet`."""
    directory = Path(files[0]).parent
    return directory.parent.parent / OVERLAY_DIR / f"{split or directory.name}.parquet"


def view_path(files: Sequence[str | os.PathLike[str]], name: str, split: str | None = None) -> Path:
    """Where view `name` of shards `files` (in `<root>/<split>/`) lives: `<root>/../views/<name>/<split>.parquet`."""
    directory = Path(files[0]).parent
    return directory.parent.parent / VIEWS_DIR / check_view_name(name) / f"{split or directory.name}.parquet"


def check_view_name(name: Any) -> str:
    """`name` when it is a view name (`[a-z0-9][a-z0-9_-]{0,63}`); else a ValueError."""
    if not isinstance(name, str) or not VIEW_NAME.fullmatch(name):
        raise ValueError(f"view: expected a view name matching {VIEW_NAME.pattern}, found {name!r}")
    return name


def missing_view(where: Any, name: str, present: Sequence[str]) -> OverlayError:
    """The error of a view that is not there, listing the views that are."""
    shown = ", ".join(present) if present else "none"
    return OverlayError(
        f"{where}: expected view {name!r} (the views stage's data/views/{name}/), found views: {shown}; add it to "
        "params.yaml `views:` and run `dvc repro` (or `dvc pull data/views`), or pass one of those"
    )


def footer_digest(tail: bytes) -> str:
    """SHA-256 of a Parquet file's tail: its footer, the footer's length and `PAR1` (what remote reads fetch)."""
    return hashlib.sha256(tail).hexdigest()


def footer_tail(path: str | os.PathLike[str], limit: int = 64 << 20) -> bytes:
    """The footer, its 4-byte length and `PAR1` of the Parquet file at `path` (two reads)."""
    with open(path, "rb") as fh:
        return tail_at(lambda n, offset: os.pread(fh.fileno(), n, offset), os.fstat(fh.fileno()).st_size, path, limit)


def tail_at(read_at: Callable[[int, int], bytes], size: int, where: Any, limit: int = 64 << 20) -> bytes:
    """`footer_tail` through `read_at(n, offset)` of an open file of `size` bytes (two reads): a reader checks the
    footer of the very file it then reads, never one opened again by name."""
    end = read_at(8, max(0, size - 8))
    length = int.from_bytes(end[:4], "little")
    if end[4:] != b"PAR1" or length + 12 > size or length > limit:
        raise FormatError(f"{where}: expected a Parquet file (ends with PAR1 after its footer), found other bytes")
    return read_at(length + 8, size - length - 8)


def curated_by_overlay(meta: dict[bytes, bytes] | None) -> bool:
    """True for shards whose labels and membership an overlay holds (format >= 6, written by convert)."""
    return (own_metadata(meta) or {}).get("curation") == CURATED_BY_OVERLAY


def content_digest(shards: Sequence[Sequence[Any]], labels: np.ndarray, keep: np.ndarray) -> str:
    """SHA-256 of what the overlay says: the shard list, every label (int64 LE) and every keep flag (one byte)."""
    digest = hashlib.sha256(json.dumps([list(s) for s in shards], separators=(",", ":")).encode())
    digest.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(keep, dtype=np.uint8).tobytes())
    return digest.hexdigest()


def overlay_table(
    split: str,
    shards: Sequence[tuple[str, int, str]],
    labels: np.ndarray,
    keep: np.ndarray,
    extra: dict[str, Any],
    label_map: dict[str, Any] | None = None,
) -> pa.Table:
    """The overlay of `split`: shards [(name, rows, footer sha256)] in order, a label and a keep flag per row.

    `label_map` (format 2): the label map its labels follow, when it is not the one stored in the shards (classes
    added or removed since some shards were written, or a view's classes renumbered); readers then take the class
    list from it. Excluded rows may carry label -1 there (a class the map no longer has)."""
    rows = np.asarray([n for _, n, _ in shards], dtype=np.int64)
    names = pa.array([name for name, _, _ in shards], pa.string())
    indices = pa.array(np.repeat(np.arange(len(shards), dtype=np.int32), rows))
    within = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
    meta = {
        "format": OVERLAY_FORMAT if label_map is None else LABEL_MAP_FORMAT,
        **({} if label_map is None else {"label_map": label_map}),
        "split": split,
        "shards": [list(s) for s in shards],
        "content_sha256": content_digest(shards, labels, keep),
        **extra,
    }
    columns = [
        pa.DictionaryArray.from_arrays(indices, names).dictionary_decode(),
        pa.array(within.astype(np.int32)),
        pa.array(np.asarray(labels, dtype=np.int64)),
        pa.array(np.asarray(keep, dtype=bool)),
    ]
    schema = OVERLAY_SCHEMA.with_metadata({OVERLAY_KEY: json.dumps(meta, sort_keys=True)})
    return pa.Table.from_arrays(columns, schema=schema)


def write_overlay(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Deterministic bytes (no timestamps): dictionary-encoded, zstd, one row group per 2^20 rows."""
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20, use_dictionary=["shard", "label"])


@dataclass(frozen=True)
class Overlay:
    """An overlay checked against the shards it is applied to: per global row of those shards (in their order)
    the label and the keep flag; `digest` identifies its content (resume states carry it)."""

    path: Path
    split: str
    labels: np.ndarray
    keep: np.ndarray
    digest: str
    edits: dict[str, int]
    label_map: dict[str, Any] | None = None  # format 2: the class list its labels follow (else the shards')
    view: str | None = None  # the view's name, when it is one

    @property
    def kept(self) -> np.ndarray:
        """The global rows kept, in order (dataset index i -> global row kept[i])."""
        return np.flatnonzero(self.keep)


def kept_order(order: np.ndarray, overlay: Overlay | None) -> np.ndarray:
    """An epoch order of global rows with the excluded ones left out: still a function of (seed, epoch)."""
    return order if overlay is None else order[overlay.keep[order]]


def _fail(path: Path, expected: str, found: str, todo: str = HELP) -> OverlayError:
    return OverlayError(f"{path}: expected {expected}, found {found}; {todo}")


def read_overlay(path: str | os.PathLike[str]) -> tuple[dict[str, Any], pa.Table]:
    """The overlay's metadata and table, its form and content digest checked (not yet against the shards)."""
    path = Path(path)
    try:
        if path.stat().st_size > OVERLAY_LIMIT:
            raise _fail(path, f"a curation overlay (<= {OVERLAY_LIMIT} bytes)", f"{path.stat().st_size} bytes")
        pf = pq.ParquetFile(path, read_dictionary=["shard"])
        meta = json.loads((pf.metadata.metadata or {})[OVERLAY_KEY])
        table = pf.read(use_threads=False)
        table.validate(full=True)  # a flipped byte in the shard names: not UTF-8 (ArrowInvalid, refused below)
    except (OSError, KeyError, ValueError, pa.ArrowException) as err:
        if isinstance(err, OverlayError):
            raise
        found = " ".join(str(err).split())  # one line: Arrow's messages span several
        raise _fail(path, "a curation overlay written by the curate stage", f"an unreadable file ({found})") from None
    known = isinstance(meta, dict) and meta.get("format") in OVERLAY_FORMATS
    if not known or table.schema.names != OVERLAY_SCHEMA.names:
        found = f"format {meta.get('format')!r}" if isinstance(meta, dict) else "another form"
        formats = " or ".join(map(str, OVERLAY_FORMATS))
        raise _fail(path, f"overlay format {formats} (columns {OVERLAY_SCHEMA.names})", f"{found} or other columns")
    if any(column.null_count for column in table.columns):
        raise _fail(path, "a shard, row, label and keep flag in every row", "nulls")
    labels = table.column("label").to_numpy()
    keep = table.column("keep").to_numpy(zero_copy_only=False)
    if content_digest(meta.get("shards", []), labels, keep) != meta.get("content_sha256"):
        raise _fail(path, "content matching its content_sha256", "other labels, flags or shards (altered)")
    _check_keys(path, meta["shards"], table)
    return meta, table


def _check_keys(path: Path, shards: list[list[Any]], table: pa.Table) -> None:
    """The `shard` and `row` columns (what joins by other tools use) agree with the shard list, row by row."""
    rows = np.asarray([int(s[1]) for s in shards], dtype=np.int64)
    shard = table.column("shard").unify_dictionaries().combine_chunks()
    names = [str(s[0]) for s, n in zip(shards, rows, strict=True) if n]  # a 0-row shard has no value
    within = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
    same = (
        len(shard) == len(within)
        and shard.dictionary.to_pylist() == names
        and np.array_equal(shard.indices.to_numpy(), np.repeat(np.arange(len(names)), rows[rows > 0]))
        and np.array_equal(table.column("row").to_numpy(), within)
    )
    if not same:
        raise _fail(path, "`shard` and `row` columns listing each shard's rows in order", "other keys (altered)")


def load_overlay(
    path: str | os.PathLike[str],
    names: Sequence[str],
    rows: Sequence[int],
    footers: Sequence[str],
    num_classes: int,
    complete: bool = False,
    *,
    view: str | None = None,
    known: Sequence[dict[str, Any]] = (),
) -> Overlay:
    """The overlay at `path` for the shards `names` (file names, in reader order) with `rows` rows and footer
    digests `footers` each: every shard must be one the overlay was made for, unchanged; `complete` (a split read
    whole, not shards picked by name): and every shard it lists must be there (a deleted one: refused, not skipped).
    Format 2 carries its own label map (`overlay_label_map`; `known`: the shards' label maps, for class names a
    stored label map leaves out): its labels are checked against that, not `num_classes`. `view`: the file must be
    that view's (metadata `view`)."""
    path = Path(path)
    meta, table = read_overlay(path)
    if view is not None and meta.get("view") != view:
        raise _fail(path, f"view {view!r} (metadata `view`)", f"view {meta.get('view')!r}")
    take = _shard_rows(path, meta, names, rows, footers, complete)
    label_map = overlay_label_map(meta, path, known)
    if view is not None and label_map is None:
        raise _fail(path, f"a view (overlay format {LABEL_MAP_FORMAT}, with its own label_map)", "overlay format 1")
    labels = table.column("label").to_numpy()[take]
    keep = table.column("keep").to_numpy(zero_copy_only=False)[take]
    _check_labels(path, labels, keep, num_classes if label_map is None else len(label_map["classes"]), label_map)
    edits = {k: int(meta.get(k, 0)) for k in ("relabelled", "excluded")}
    digest = str(meta["content_sha256"])
    return Overlay(path, str(meta.get("split")), labels, keep, digest, edits, label_map, view)


def _shard_rows(
    path: Path, meta: dict[str, Any], names: Sequence[str], rows: Sequence[int], footers: Sequence[str], complete: bool
) -> np.ndarray:
    """The overlay's rows of shards `names`, in that order, each shard checked (rows, footer) against its entry."""
    listed = {str(s[0]): (i, int(s[1]), str(s[2])) for i, s in enumerate(meta["shards"])}
    missing = sorted(set(listed) - set(names)) if complete else []
    if missing:
        raise _fail(
            path,
            f"shard {missing[0]} beside the others (it lists {len(listed)} shards for this split)",
            f"no such file ({len(missing)} of its shards missing: deleted, or not pulled)",
            "run `dvc pull` (or `dvc checkout`) the shards and data/overlay of one version together, or `dvc repro`",
        )
    starts = np.concatenate([[0], np.cumsum([int(s[1]) for s in meta["shards"]])]).astype(np.int64)
    pieces = []
    for name, count, footer in zip(names, rows, footers, strict=True):
        i, want_rows, want_footer = listed.get(name, (-1, -1, ""))
        if i < 0:
            raise _fail(path, f"an entry for shard {name}", f"shards {sorted(listed)[:3]}... (another version)")
        if (want_rows, want_footer) != (count, footer):
            raise _fail(
                path,
                f"shard {name} with {want_rows} rows and footer sha256 {want_footer[:16]}…",
                f"{count} rows and footer sha256 {footer[:16]}… (the shard changed, or its footer was altered)",
            )
        pieces.append(np.arange(starts[i], starts[i + 1]))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _check_labels(
    path: Path, labels: np.ndarray, keep: np.ndarray, num_classes: int, label_map: dict[str, Any] | None
) -> None:
    """Kept rows: a label 0..num_classes-1; excluded ones too, or (format 2) EXCLUDED_LABEL."""
    low = EXCLUDED_LABEL if label_map is not None else 0
    bad = (labels >= num_classes) | (labels < np.where(keep, 0, low))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        allowed = f"0..{num_classes - 1}" + (f" ({EXCLUDED_LABEL} on excluded rows only)" if low < 0 else "")
        what = "kept" if keep[row] else "excluded"
        raise _fail(path, f"labels in {allowed}", f"label {labels[row]} on a {what} row ({row})")


def overlay_label_map(meta: dict[str, Any], path: Path, known: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
    """The label map a format-2 overlay carries, whole (as label_map.json: `classes` with label, name, ...), or None
    (format 1: the shards' own). Stored as label_map.json (what the writers should store: it has the class names)
    or as shards store it (`stored_label_map`, no names: then those of the same wnids in `known`, the shards' label
    maps — a folder dataset's classes have no wnid, so its label map must be stored whole)."""
    if meta.get("format") != LABEL_MAP_FORMAT:
        return None
    stored = meta.get("label_map")
    try:
        whole = stored if isinstance(stored, dict) and "classes" in stored else _unstored(stored, known)
        class_names(whole)
    except (FormatError, KeyError, TypeError, AttributeError) as err:
        raise _fail(path, "a `label_map` (labels 0..K-1 with their class names) in its metadata", str(err)) from None
    return whole


def _unstored(stored: Any, known: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A `stored_label_map` made whole again, its names from its own `name` field or the wnids of `known`."""
    fields = stored.get(CLASS_FIELDS) if isinstance(stored, dict) else None
    count = stored.get("num_classes") if isinstance(stored, dict) else None
    if (
        not isinstance(fields, dict)
        or not isinstance(count, int)
        or any(not isinstance(v, list) or len(v) != count for v in fields.values())
    ):
        raise FormatError(f"no label map (or `{CLASS_FIELDS}` lists that are not num_classes long)")
    by_wnid = {c.get("wnid"): c.get("name") for m in known for c in m.get("classes", []) if c.get("wnid")}
    names = fields.get("name") or [by_wnid.get(w) for w in fields.get("wnid", [None] * count)]
    if any(not isinstance(n, str) for n in names):
        raise FormatError(
            "a label map stored without class names, for classes no shard names by wnid (store it whole, as "
            "label_map.json, with the names)"
        )
    classes = [{"label": i, "name": n, **{k: v[i] for k, v in fields.items()}} for i, n in enumerate(names)]
    rest = {k: v for k, v in stored.items() if k != CLASS_FIELDS}
    return {**rest, "classes": classes}


def resolve_overlay(
    overlay: Any,
    files: Sequence[Path],
    split: str | None,
    rows: Sequence[int],
    num_classes: int,
    first_footer: dict[bytes, bytes] | None,
    found: Path | None = None,
    footers: Sequence[str] | None = None,
    complete: bool = False,
    *,
    view: str | None = None,
    known: Sequence[dict[str, Any]] = (),
) -> Overlay | None:
    """The overlay a reader applies: `overlay` "auto" (the default: `overlay_path`; remote shards, whose `footers`
    digests are given: `found`, fetched and checked, None for a version without one), a path, or False/None
    (labels as converted); local shards whose footers the caller read pass the overlay path as `found` and those
    `footers`. Shards that say they are curated by an overlay (`first_footer`, format >= 6) are refused without one,
    unless `overlay` is False. `complete`: the shards are a whole split (load_overlay). `view`: the named view's
    file (`view_path`, or `found`) instead of the overlay — it already applies it, so `overlay` must be "auto"."""
    auto = isinstance(overlay, str) and overlay == "auto"
    if view is not None:
        return _resolve_view(view, auto, overlay, files, split, rows, found, footers, complete, known)
    if overlay is False or overlay is None:
        return None
    if auto and (own_metadata(first_footer) or {}).get("curation") == CURATION_APPLIED:
        return None  # compacted shards (tasks/curate/compact.py): the curation is in them; data/overlay is not theirs
    path = (overlay_path(files, split) if footers is None else found) if auto else Path(overlay)
    if path is None or not path.is_file():
        if not auto:
            raise OverlayError(f"overlay: expected a curation overlay file, found no file {path}; {HELP}")
        if curated_by_overlay(first_footer):
            raise OverlayError(
                f"{Path(files[0]).parent}: expected its curation overlay at {path} (these shards take their labels "
                f"and exclusions from it), found none; {HELP}, or pass overlay=PATH — or overlay=False to read the "
                "labels as converted, without the curation"
            )
        return None
    digests = list(footers) if footers is not None else [footer_digest(footer_tail(f)) for f in files]
    return load_overlay(path, [Path(f).name for f in files], rows, digests, num_classes, complete, known=known)


def _resolve_view(
    view: str,
    auto: bool,
    overlay: Any,
    files: Sequence[Path],
    split: str | None,
    rows: Sequence[int],
    found: Path | None,
    footers: Sequence[str] | None,
    complete: bool,
    known: Sequence[dict[str, Any]],
) -> Overlay:
    """View `view` of `files` (resolve_overlay), checked as an overlay is, and named as that view."""
    check_view_name(view)
    if not auto:
        raise ValueError(
            f"view and overlay: expected one of them (a view already applies the curation overlay), found "
            f"view={view!r} and overlay={overlay!r}; drop overlay="
        )
    path = found if found is not None else view_path(files, view, split)
    if not path.is_file():
        views = path.parent.parent
        present = sorted(d.name for d in views.iterdir() if (d / path.name).is_file()) if views.is_dir() else []
        raise missing_view(views, view, present)
    digests = list(footers) if footers is not None else [footer_digest(footer_tail(f)) for f in files]
    names = [Path(f).name for f in files]
    return load_overlay(path, names, rows, digests, 0, complete, view=view, known=known)

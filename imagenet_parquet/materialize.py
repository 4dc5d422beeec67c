"""A local copy of a split or a view, holding only its rows: `python -m imagenet_parquet.materialize`.

    python -m imagenet_parquet.materialize /local/imagenet100 --repo . --split train --view imagenet100 \\
        --cache-dir /scratch/cache --cache-limit 50GB        # from the DVC remote: only the view's bytes fetched
    python -m imagenet_parquet.materialize /local/train --root data/parquet --split train   # from local shards

Writes `<out>/<split>/<split>-00000.parquet, ...` with the rows of the curated split (or of view `--view`), in the
dataset's order, each image read and checked against its sha256 (remote reads always are; local ones with
`verify=True`), with the labels the reader yields (the overlay's, or the view's 0..K-1) stored in the shards and the
matching label map in their metadata (`curation: applied`, as compacted shards: every reader path takes them as
they are, and so do DuckDB, polars, pandas and Hugging Face `datasets`); the footer byte index is written anew by
the project's one shard writer (writer.py). The same source and arguments give byte-identical shards on every node
and every run (no path, no time in them). `<out>/<split>/materialized.json` says what was written (the source's
footer and curation digests, the shards with their rows and md5): a later run replaces only a directory that file
describes exactly, and refuses any other; the new one is written beside it and swapped in whole, so a killed run
leaves the previous copy or the new one, never a mix."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import COLUMNS, FormatError, class_names, decode_image_index, own_metadata, shard_schema
from .overlay import CURATION_APPLIED
from .writer import ShardWriter

MARKER = "materialized.json"
PARTIAL = ".materializing"  # in the directory being written: what a later run may delete
MARKER_FORMAT = 1
COPIED = [c for c in COLUMNS if c not in ("image", "label", "wnid", "label_name")]  # taken from the source as is


def plan_shards(sizes: np.ndarray, target: int) -> list[tuple[int, int]]:
    """[start, end) ranges of rows, in order, each ending at the first row that brings its image bytes to `target`
    (the last one shorter): a function of the sizes only."""
    cuts, total, start = [], 0, 0
    for i, size in enumerate(np.asarray(sizes, dtype=np.int64).tolist()):
        total += size
        if total >= target:
            cuts.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes) or not cuts:
        cuts.append((start, len(sizes)))
    return cuts


class Source:
    """The rows of a reader dataset (ParquetImageDataset, local or from_dvc), in its order, as shard rows."""

    def __init__(self, dataset: Any):
        self.ds = dataset
        self.remote = dataset.remote
        first = self.remote.footer(0) if self.remote is not None else pq.read_metadata(dataset.files[0])
        self.own = own_metadata(first.metadata) or {}
        self.names = class_names(dataset.label_map)
        self.wnids = [c.get("wnid") for c in sorted(dataset.label_map["classes"], key=lambda c: c["label"])]
        self._file, self._columns = -1, pa.table({})

    def sizes(self) -> np.ndarray:
        """The image bytes of every row of the dataset, in its order (the footers' byte index)."""
        every = np.concatenate([self._index(f)[:, 1] for f in range(len(self.ds.files))])  # by global row
        kept = np.arange(len(every)) if self.ds.overlay is None else np.flatnonzero(self.ds.overlay.keep)
        sizes: np.ndarray = every[kept]
        return sizes

    def _index(self, file: int) -> np.ndarray:
        meta = self.remote.footer(file) if self.remote is not None else pq.read_metadata(self.ds.files[file])
        found = decode_image_index(meta.metadata, meta.num_rows, self.ds.files[file])
        if found is None:
            raise FormatError(
                f"{self.ds.files[file]}: expected the footer byte index the convert stage writes, found none; "
                "materialise shards written by this project's convert stage"
            )
        return found

    def rows(self, start: int, end: int) -> Iterator[dict[str, Any]]:
        """Dataset rows [start, end): the image read (and checked) through the reader, its label the reader's."""
        for i in range(start, end):
            g = self.ds._global(i)
            data, label = self.ds._read_row(g)
            file, file_row = self.ds.index.locate_file(self.ds.index.locate(g)[0], g)
            columns = self._small(file)
            row = {name: columns.column(name)[file_row].as_py() for name in COPIED if name in columns.column_names}
            path = columns.column("image")[file_row].as_py()["path"]
            yield {
                "image": {"bytes": data, "path": path},
                "label": label,
                "wnid": self.wnids[label],
                "label_name": self.names[label],
                **row,
            }

    def _small(self, file: int) -> pa.Table:
        """The source file's small columns (one file at a time: only their column chunks are read)."""
        if file != self._file:
            wanted = ["image.path", *COPIED]
            read = self.remote.read_columns if self.remote is not None else self.ds.index.read_columns
            self._file, self._columns = file, read(file, wanted)
        return self._columns

    def schema(self, split: str) -> pa.Schema:
        fingerprinted = self.own.get("fingerprint_algorithm") is not None
        params = self.own.get("convert_params") or {}
        return shard_schema(self.ds.label_map, params, split, fingerprinted, curation=CURATION_APPLIED)

    def identity(self) -> dict[str, Any]:
        """What the copy was made from, machine-independent: the source shards' footer digests and the curation."""
        footers = self.remote.footer_digests() if self.remote is not None else list(self.ds.index.footers)
        return {
            "footers_sha256": hashlib.sha256("\n".join(footers).encode()).hexdigest(),
            "curation": None if self.ds.overlay is None else self.ds.overlay.digest,
            "view": self.ds.view,
        }


def materialize(
    dataset: Any, split: str, out: Path, shard_mb: float = 256.0, row_group_rows: int | None = None
) -> dict[str, Any]:
    """`out/<split>/` made of the dataset's rows (see the module's text); returns what materialized.json says."""
    check_split(split)
    source = Source(dataset)
    rows_per_group = int(row_group_rows or (source.own.get("convert_params") or {}).get("row_group_rows") or 100)
    target = out / split
    previous = owned(target)
    partial = out / f".{split}.partial"
    if partial.exists():
        if not (partial / PARTIAL).is_file():
            raise FormatError(
                f"{partial}: expected a killed run's partial copy (holding {PARTIAL}), found other files; "
                "remove it yourself or pass another output directory"
            )
        shutil.rmtree(partial)  # a killed run's: never read by anyone
    partial.mkdir(parents=True)
    (partial / PARTIAL).touch()
    schema, shards = source.schema(split), []
    for n, (start, end) in enumerate(plan_shards(source.sizes(), int(shard_mb * 1e6))):
        name = f"{split}-{n:05d}.parquet"
        writer = ShardWriter(partial / name, schema, rows_per_group)
        count = writer.write(source.rows(start, end))
        shards.append([name, count, writer.md5, (partial / name).stat().st_size])
    report = {
        "format": MARKER_FORMAT,
        "split": split,
        **source.identity(),
        "rows": dataset.num_images,
        "classes": len(source.names),
        "shards": shards,
    }
    (partial / MARKER).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (partial / PARTIAL).unlink()
    _swap(partial, target, previous)
    return report


def check_split(split: str) -> str:
    """`split`, when it is a plain name (the output directory <out>/<split> stays inside <out>)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", split):
        raise ValueError(
            f"--split: expected a split name such as train or val (letters, digits, _ and -), found {split!r}"
        )
    return split


def owned(target: Path) -> bool:
    """True when `target` holds a copy this command wrote, unchanged (its materialized.json lists exactly its
    files, with their sizes); False when there is none; else a FormatError: never replace what is not ours."""
    if not target.exists():
        return False
    marker = target / MARKER
    try:
        report = json.loads(marker.read_text(encoding="utf-8"))
        listed = {str(s[0]): int(s[3]) for s in report["shards"]}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        listed = None
    found = {p.name: p.stat().st_size for p in sorted(target.iterdir()) if p.name != MARKER}
    if listed is None or found != listed:
        raise FormatError(
            f"{target}: expected a directory `python -m imagenet_parquet.materialize` wrote (its {MARKER} listing "
            f"exactly the files in it), found {'no such listing' if listed is None else 'other files'}; pass another "
            "output directory, or remove this one yourself"
        )
    return True


def _swap(partial: Path, target: Path, previous: bool) -> None:
    """`partial` becomes `target` (the previous copy, ours, removed after)."""
    if previous:
        old = target.with_name(f".{target.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.rename(target, old)
        os.rename(partial, target)
        shutil.rmtree(old)
    else:
        os.rename(partial, target)


def _dataset(args: argparse.Namespace) -> Any:
    from .datasets import ParquetImageDataset

    common: dict[str, Any] = {"decode": False, "view": args.view}
    if args.root is not None:
        return ParquetImageDataset(args.root, args.split, verify=True, **common)
    limit = {"cache_limit": args.cache_limit} if args.cache_limit else {}
    return ParquetImageDataset.from_dvc(
        args.repo, args.path, args.rev, args.remote, split=args.split, cache_dir=args.cache_dir, **limit, **common
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m imagenet_parquet.materialize", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="output directory: <out>/<split>/ is written")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", type=Path, help="local Parquet root (data/parquet: shards pulled or converted)")
    where.add_argument("--repo", type=Path, help="a checkout (dvc.lock + .dvc/config): read from the DVC remote")
    p.add_argument("--path", default="data/parquet", help="with --repo: the DVC-tracked Parquet root")
    p.add_argument("--rev", help="with --repo: a git revision (that version's dvc.lock)")
    p.add_argument("--remote", help="with --repo: a remote name or URL (default: core.remote)")
    p.add_argument("--cache-dir", type=Path, help="with --repo: the node cache (default ~/.cache/imagenet-parquet)")
    p.add_argument("--cache-limit", help="with --repo: the node cache's bound, e.g. 50GB (default 20GB)")
    p.add_argument("--split", default="train")
    p.add_argument("--view", help="a named view (params.yaml views:) instead of the whole curated split")
    p.add_argument("--shard-mb", type=float, default=256.0, help="image bytes per output shard (default 256)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .dvcconfig import RemoteError

    try:
        check_split(args.split)
        if args.shard_mb <= 0:
            raise ValueError(f"--shard-mb: expected > 0, found {args.shard_mb}")
        report = materialize(_dataset(args), args.split, args.out, args.shard_mb)
    except (FormatError, RemoteError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(
            f"error: {err.filename or args.out}: {os.strerror(err.errno or 0)} (errno {err.errno}) while writing "
            f"{args.out}; free some space or fix its permissions, then run again (nothing was replaced)",
            file=sys.stderr,
        )
        return 1
    size = sum(s[3] for s in report["shards"])
    print(
        f"{args.split}{f' (view {args.view})' if args.view else ''}: {report['rows']} rows, "
        f"{report['classes']} classes, {len(report['shards'])} shards, {size / 1e6:.1f} MB -> {args.out / args.split}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

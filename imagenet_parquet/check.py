"""Check a pulled tree against the version dvc.lock names, without DVC: `python -m imagenet_parquet.check`.

    python -m imagenet_parquet.check [--repo .] [--parquet data/parquet] [--full] [--view NAME]

Quick (the default; seconds at ImageNet scale): the `.dir` listings of the shards' and the overlay's outs (from the
local DVC cache, each checked against the md5 dvc.lock gives it) name exactly the files present; each overlay file
has the md5 its listing gives it; every shard's footer (label map, byte index, row counts) has the SHA-256 its
split's overlay records. `--full` also hashes every shard whole against the listing (reads every byte: about as long
as copying the tree). `--view NAME`: also the views' out (data/views: listing, md5 of each file) and every shard's
footer against view NAME's file of its split. Prints one line per problem and exits 1 when there is any, else a
summary, exit 0.
Needs PyYAML (`pip install 'imagenet-parquet[remote]'`) to read dvc.lock."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from .dvcremote import RemoteError, lock_out
from .format import FormatError
from .overlay import (
    OVERLAY_DIR,
    VIEWS_DIR,
    OverlayError,
    check_view_name,
    footer_digest,
    footer_tail,
    load_overlay,
    missing_view,
)
from .shards import label_maps_of


def _md5(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def listing(repo: Path, out: str) -> dict[str, str]:
    """{relpath: md5} of the `.dir` listing of dvc.lock's out `out`, from the local DVC cache, checked."""
    root, md5 = lock_out(repo, out, None)
    if not md5.endswith(".dir"):
        return {PurePosixPath(root).name: md5}
    obj = md5.removesuffix(".dir")
    for cached in (
        repo / ".dvc/cache/files/md5" / obj[:2] / f"{obj[2:]}.dir",
        repo / ".dvc/cache" / obj[:2] / f"{obj[2:]}.dir",
    ):
        if cached.is_file():
            if _md5(cached) != obj:
                raise RemoteError(
                    f"{cached}: expected md5 {obj} (dvc.lock's {out}), found other bytes; `dvc pull` again"
                )
            return {str(e["relpath"]): str(e["md5"]) for e in json.loads(cached.read_text(encoding="utf-8"))}
    raise RemoteError(
        f"{repo}/.dvc/cache: expected the listing {md5} of {out} (dvc.lock), found none; run `dvc pull {out}`"
    )


def check(
    repo: Path, parquet: str = "data/parquet", full: bool = False, view: str | None = None
) -> tuple[list[str], dict[str, int]]:
    """(problems, counts) of the tree at `repo` against its dvc.lock (see the module doc)."""
    overlay = str(PurePosixPath(parquet).parent / OVERLAY_DIR)
    shards, overlays = listing(repo, parquet), listing(repo, overlay)
    problems = _membership(repo / parquet, shards) + _membership(repo / overlay, overlays)
    problems += _md5s(repo / overlay, overlays)
    splits = sorted({rel.split("/")[0] for rel in shards if rel.endswith(".parquet") and "/" in rel})
    for split in splits:
        problems += _footers(repo / parquet / split, repo / overlay / f"{split}.parquet")
    if view is not None:
        problems += _view(repo, parquet, check_view_name(view), splits)
    if full:
        for rel, md5 in sorted(shards.items()):
            if (repo / parquet / rel).is_file() and _md5(repo / parquet / rel) != md5:
                problems.append(f"{repo / parquet / rel}: expected md5 {md5} (dvc.lock's listing), found other bytes")
    return problems, {"shards": sum(rel.endswith(".parquet") for rel in shards), "splits": len(splits)}


def _md5s(root: Path, listed: dict[str, str]) -> list[str]:
    """A line for each present file of `listed` ({relpath: md5}, under `root`) whose md5 is another."""
    return [
        f"{root / rel}: expected md5 {md5} (dvc.lock's listing), found other bytes"
        for rel, md5 in sorted(listed.items())
        if (root / rel).is_file() and _md5(root / rel) != md5
    ]


def _view(repo: Path, parquet: str, view: str, splits: list[str]) -> list[str]:
    """The views' out against dvc.lock (membership, md5s), and each split's footers against view `view`'s file."""
    views = str(PurePosixPath(parquet).parent / VIEWS_DIR)
    listed = listing(repo, views)
    present = sorted({rel.split("/")[0] for rel in listed if "/" in rel})
    if view not in present:
        return [str(missing_view(repo / views, view, present))]
    problems = _membership(repo / views, listed) + _md5s(repo / views, listed)
    for split in splits:
        if f"{view}/{split}.parquet" in listed:
            problems += _footers(repo / parquet / split, repo / views / view / f"{split}.parquet", view)
    return problems


def _membership(root: Path, listed: dict[str, str]) -> list[str]:
    present = (
        {p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else set()
    )
    missing = [f"{root / rel}: expected (dvc.lock lists it), found no file" for rel in sorted(set(listed) - present)]
    return missing + [
        f"{root / rel}: expected no such file (not in dvc.lock's listing)" for rel in sorted(present - set(listed))
    ]


def _footers(split_dir: Path, overlay: Path, view: str | None = None) -> list[str]:
    files = sorted(split_dir.glob("*.parquet"))
    if not overlay.is_file() or not files:
        return []
    digests, metas = [], []
    for f in files:
        try:
            digests.append(footer_digest(footer_tail(f)))
            metas.append(pq.read_metadata(f))
        except (FormatError, OSError, pa.ArrowException) as err:
            return [f"{f}: expected a Parquet footer that parses, found: {err}; `dvc pull` it again"]
    rows = [m.num_rows for m in metas]
    try:
        known = label_maps_of(files, metas, True)[0]  # class names of a label map stored without them (views)
        load_overlay(overlay, [f.name for f in files], rows, digests, 1 << 62, view=view, known=known)
    except (OverlayError, FormatError, OSError) as err:
        return [str(err)]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imagenet_parquet.check", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=Path("."), help="the project checkout (dvc.lock, .dvc/cache)")
    parser.add_argument("--parquet", default="data/parquet", help="the shards' out in dvc.lock")
    parser.add_argument("--full", action="store_true", help="also hash every shard whole")
    parser.add_argument("--view", help="also check the views' out and every shard against this view's file")
    args = parser.parse_args(argv)
    try:
        problems, counts = check(args.repo, args.parquet, args.full, args.view)
    except (RemoteError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    what = "footers, overlays and every shard's md5" if args.full else "footers and overlays"
    what += f", view {args.view}" if args.view else ""
    print(f"{len(problems)} problem(s) in {counts['shards']} shards of {counts['splits']} split(s) ({what} checked)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

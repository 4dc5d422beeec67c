"""Folder mode: index an already-extracted `train/<class>/*`, `val/<class>/*` tree (how ImageNet100, Places365,
iNaturalist or anyone's own labelled folders are shared).

A class folder may have any UTF-8 name that is a safe path component (`tasks.common.synsets.class_name_problem`):
every directory entry that is a directory (links followed) is a class, as torchvision's ImageFolder sees it.
Images are files with extension .JPEG/.jpeg/.jpg/.png in any case; anything else is reported and skipped. A
class folder without images is reported; the class then counts as absent from that split."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from tasks.common import PipelineError
from tasks.common.synsets import class_name_problem
from tasks.common.tarindex import NOT_IMAGE, NOT_UTF8, collisions, is_image, is_utf8, printable, report

Row = dict[str, object]


def source_path(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """`path` relative to `root` when inside it, else absolute (symlinks are not resolved: a linked archive
    keeps its name inside the repo)."""
    absolute, base = os.path.abspath(path), os.path.abspath(root)
    inside = os.path.commonpath([absolute, base]) == base
    return Path(os.path.relpath(absolute, base)).as_posix() if inside else Path(absolute).as_posix()


def _sorted_entries(directory: Path) -> list[os.DirEntry[str]]:
    with os.scandir(directory) as it:
        return sorted(it, key=lambda e: e.name)


def scan_folder_split(
    folder: str | os.PathLike[str], split: str, root: str | os.PathLike[str], schema: pa.Schema
) -> tuple[pa.Table, list[dict[str, str]]]:
    """One row per image of `<folder>/<split>/<class>/` (a table of `schema`), plus report entries (skipped files,
    empty classes). Each class's rows become Arrow columns as it is scanned: no Python object per image is kept
    (~800 B an image as dicts: 10 GB at ImageNet-21k's 13 M)."""
    base = Path(folder) / split
    if not base.is_dir():
        hint = " (or, for a source without a val split, set extract.holdout)" if split != "train" else ""
        raise PipelineError(
            f"{base}: expected the {split} folder of an ImageFolder tree ({split}/<class>/<image>), "
            f"found no such directory; set extract.folder to the tree's root{hint}"
        )
    tables = [schema.empty_table()]
    reported: list[dict[str, str]] = []
    for entry in _sorted_entries(base):
        if not entry.is_dir():
            reported.append(report(split, source_path(entry.path, root), "", "not a class folder"))
            continue
        problem = class_name_problem(entry.name)
        if problem:
            raise PipelineError(
                f"{printable(entry.path)}: expected a class folder named by one safe path component (any UTF-8 "
                f"name without control characters or separators), found {problem}; rename or remove it"
            )
        found, notes = _scan_class(Path(entry.path), entry.name, split, root)
        tables.append(pa.Table.from_pylist(found, schema=schema))
        reported += notes
    return pa.concat_tables(tables).combine_chunks(), reported


def _scan_class(
    directory: Path, name: str, split: str, root: str | os.PathLike[str]
) -> tuple[list[Row], list[dict[str, str]]]:
    rows: list[Row] = []
    reported: list[dict[str, str]] = []
    for entry in _sorted_entries(directory):
        source = source_path(entry.path, root)
        reason = _skip_reason(entry)
        if reason:
            reported.append(report(split, source, "", reason))
            continue
        rows.append(
            {
                "wnid": name,  # the class key: its folder name (docs/CONTRACTS.md)
                "name": entry.name,
                "source": source,
                "member": "",
                "offset": 0,
                "size": entry.stat().st_size,
            }
        )
    if not rows:
        reported.append(
            report(
                split,
                source_path(directory, root),
                "",
                "empty class folder (no images)",
                action=f"class {name} counts as absent from {split}",
            )
        )
    reported += collisions(split, source_path(directory, root), [str(r["name"]) for r in rows])
    return rows, reported


def _skip_reason(entry: os.DirEntry[str]) -> str | None:
    if not is_utf8(entry.name):
        return NOT_UTF8
    if entry.is_dir():
        return "nested folder (not scanned)"
    if not entry.is_file():
        return "not a regular file (broken link, device or FIFO)"
    if not is_image(entry.name):
        return NOT_IMAGE
    return None

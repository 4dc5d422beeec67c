"""Folder mode: index an already-extracted `train/<class>/...`, `val/<class>/...` tree (how ImageNet100, Places365,
iNaturalist or anyone's own labelled folders are shared), labelled as torchvision's ImageFolder labels it.

The rule is ImageFolder's (torchvision/datasets/folder.py `find_classes`, `make_dataset`): every directory entry
of the split folder that is a directory (links followed, hidden ones included) is a class, named by any UTF-8 name
that is a safe path component (`tasks.common.synsets.class_name_problem`); its images are the files anywhere below
it (sub-folders walked, links followed) whose name ends, in any case, with one of IMAGEFOLDER_EXTENSIONS. A
manifest `name` is the image's path relative to its class folder (`sub/x.jpg`; the file name when not nested).
Anything else is reported and skipped. A class folder without such files is reported and counts as absent from
that split (ImageFolder refuses it unless `allow_empty`). Refused, naming the path: a symbolic link loop (ImageFolder
would list the images below it again at every level until the OS gives up), and a class that ImageFolder counts
but whose every image file is unreadable here (a dangling link, a name not UTF-8): it would vanish and shift every
later label. Class names equal after Unicode normalization (`café` composed and decomposed) stay two classes, as
in ImageFolder, with a warning."""

from __future__ import annotations

import errno
import os
import unicodedata
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from tasks.common import PipelineError
from tasks.common.synsets import class_name_problem
from tasks.common.tarindex import NOT_UTF8, collisions, is_utf8, printable, report

Row = dict[str, object]
Ancestors = dict[tuple[int, int], str]  # (device, inode) of each folder above in the walk -> its path
# torchvision.datasets.folder.IMG_EXTENSIONS, compared case-insensitively (archives keep tarindex.IMAGE_EXTENSIONS)
IMAGEFOLDER_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
NOT_FOLDER_IMAGE = f"not an image (extension not one of ImageFolder's {', '.join(IMAGEFOLDER_EXTENSIONS)})"
NOT_REGULAR = "not a regular file (broken link, device or FIFO)"


def source_path(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """`path` relative to `root` when inside it, else absolute (symlinks are not resolved: a linked archive
    keeps its name inside the repo)."""
    absolute, base = os.path.abspath(path), os.path.abspath(root)
    inside = os.path.commonpath([absolute, base]) == base
    return Path(os.path.relpath(absolute, base)).as_posix() if inside else Path(absolute).as_posix()


def is_folder_image(name: str) -> bool:
    """ImageFolder's `has_file_allowed_extension(name, IMG_EXTENSIONS)`."""
    return name.lower().endswith(IMAGEFOLDER_EXTENSIONS)


def _loop(path: str, found: str) -> PipelineError:
    return PipelineError(
        f"{printable(path)}: expected a folder tree without cycles (ImageFolder follows links and would list the "
        f"images below a loop again at every level), found a symbolic link loop ({found}); remove the link or "
        "point it elsewhere"
    )


def _unreadable(path: str, err: OSError) -> PipelineError:
    if err.errno == errno.ELOOP:
        return _loop(path, "links that lead back to themselves: too many levels of symbolic links")
    return PipelineError(
        f"{printable(path)}: expected a readable folder, found {err.strerror or err}; fix its permissions or remove it"
    )


def _sorted_entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as err:
        raise _unreadable(str(directory), err) from None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A directory, links followed (os.walk's test: an entry it cannot stat is a file)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _identity(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError as err:
        raise _unreadable(path, err) from None
    return stat.st_dev, stat.st_ino


def scan_folder_split(
    folder: str | os.PathLike[str], split: str, root: str | os.PathLike[str], schema: pa.Schema
) -> tuple[pa.Table, list[dict[str, str]]]:
    """One row per image of `<folder>/<split>/<class>/` (a table of `schema`), plus report entries (skipped files,
    empty classes, look-alike class names). Each class's rows become Arrow columns as it is scanned: no Python
    object per image is kept (~800 B an image as dicts: 10 GB at ImageNet-21k's 13 M)."""
    base = Path(folder) / split
    if not base.is_dir():
        hint = " (or, for a source without a val split, set extract.holdout)" if split != "train" else ""
        raise PipelineError(
            f"{base}: expected the {split} folder of an ImageFolder tree ({split}/<class>/<image>), "
            f"found no such directory; set extract.folder to the tree's root{hint}"
        )
    tables = [schema.empty_table()]
    reported: list[dict[str, str]] = []
    classes: list[str] = []
    top = {_identity(str(base)): str(base)}
    for entry in _sorted_entries(base):
        if not _class_folder(entry):
            reported.append(report(split, source_path(entry.path, root), "", "not a class folder"))
            continue
        found, notes = _scan_class(Path(entry.path), entry.name, split, root, top)
        tables.append(pa.Table.from_pylist(found, schema=schema))
        reported += notes
        classes.append(entry.name)
    reported = _lookalikes(split, source_path(base, root), classes) + reported  # first: the log shows the first 20
    return pa.concat_tables(tables).combine_chunks(), reported


def _class_folder(entry: os.DirEntry[str]) -> bool:
    """ImageFolder's `entry.is_dir()` (links followed; a link loop, on which it fails, is refused naming it)."""
    try:
        if not entry.is_dir():
            return False
    except OSError as err:
        raise _unreadable(entry.path, err) from None
    problem = class_name_problem(entry.name)
    if problem:
        raise PipelineError(
            f"{printable(entry.path)}: expected a class folder named by one safe path component (any UTF-8 "
            f"name without control characters or separators), found {problem}; rename or remove it"
        )
    return True


def _files(directory: Path, prefix: str, ancestors: Ancestors) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(path relative to the class folder, entry) of every non-folder below `directory`, sorted by name at each
    level: os.walk(followlinks=True)'s files, a folder reached again through a link refused as a loop."""
    for entry in _sorted_entries(directory):
        relative = prefix + entry.name
        if not _is_dir(entry):
            yield relative, entry
            continue
        identity = _identity(entry.path)
        if identity in ancestors:
            raise _loop(entry.path, f"it leads back to {printable(ancestors[identity])}")
        yield from _files(Path(entry.path), relative + "/", {**ancestors, identity: entry.path})


def _scan_class(
    directory: Path, name: str, split: str, root: str | os.PathLike[str], above: Ancestors
) -> tuple[list[Row], list[dict[str, str]]]:
    rows: list[Row] = []
    reported: list[dict[str, str]] = []
    unreadable: list[str] = []  # files ImageFolder counts as images that cannot be indexed
    for relative, entry in _files(directory, "", {**above, _identity(str(directory)): str(directory)}):
        source = source_path(entry.path, root)
        reason = _skip_reason(entry, relative)
        if reason:
            reported.append(report(split, source, "", reason))
            unreadable += [source] if is_folder_image(relative) else []
            continue
        rows.append(
            {
                "wnid": name,  # the class key: its folder name (docs/CONTRACTS.md)
                "name": relative,  # the image's path below its class folder (docs/CONTRACTS.md)
                "source": source,
                "member": "",
                "offset": 0,
                "size": entry.stat().st_size,
            }
        )
    if not rows and unreadable:
        raise PipelineError(
            f"{printable(str(directory))}: expected a class ImageFolder counts (it has files named as images) to "
            f"hold an image that can be read, found {len(unreadable)} unreadable, e.g. {printable(unreadable[0])} "
            f"({_skip_reason_of(reported, unreadable[0])}); without it the class would vanish and every later "
            "label would differ from ImageFolder's: fix or remove those files"
        )
    if not rows:
        where = source_path(directory, root)
        action = f"class {name} counts as absent from {split}"
        reported.append(report(split, where, "", "empty class folder (no images)", action=action))
    reported += collisions(split, source_path(directory, root), [str(r["name"]) for r in rows])
    return rows, reported


def _skip_reason_of(reported: list[dict[str, str]], source: str) -> str:
    return next(item["reason"] for item in reported if item["source"] == source)


def _skip_reason(entry: os.DirEntry[str], relative: str) -> str | None:
    if not is_utf8(relative):
        return NOT_UTF8
    if not is_folder_image(entry.name):
        return NOT_FOLDER_IMAGE
    try:
        regular = entry.is_file()
    except OSError:
        regular = False
    return None if regular else NOT_REGULAR


def _lookalikes(split: str, where: str, classes: list[str]) -> list[dict[str, str]]:
    """Class names equal after Unicode NFC normalization: kept apart (as ImageFolder does), warned (the stage logs
    the report's first entries)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in classes:
        groups[unicodedata.normalize("NFC", name)].append(name)
    return [
        report(
            split,
            where,
            " | ".join(names),
            f"{len(names)} class folder names are equal after Unicode normalization (NFC: composed vs decomposed "
            "accents): they look the same but are different classes",
            action="kept apart, as ImageFolder keeps them (one label each); rename the folders to merge them",
        )
        for _, names in sorted(groups.items())
        if len(names) > 1
    ]

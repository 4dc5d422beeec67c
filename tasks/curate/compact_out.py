"""Where compaction (tasks/curate/compact.py) may write, and how it publishes a compacted set.

Compaction replaces its output directory whole, so it writes only into a directory it owns: a new one (absent or
empty) or one it wrote before, and of that one only what it wrote. Its MARKER lists every file of the set (name,
size, MD5: `Marker`, checked whole, one line for any problem); a later compaction replaces the directory only when
every file in it and in its split folders is listed there and unchanged (MD5 from DVC's state for the file as it is
now, else hashed) — anything else (a README a user put into `train/`, a changed shard, an empty or unreadable
marker, a marker of an earlier version that lists nothing) is refused in one line before anything is written, and
checked again (by size, mtime and inode) just before the previous set is removed. Never a source or an output
of the pipeline (every `paths:` entry, the source and table files params.yaml names, `curation/`, `.git`, `.dvc`),
nor inside or above one of them. A set (every split and compaction.json) is written under a temporary sibling and
published as one directory (tasks.common.atomic_path): a reader sees the previous set or the new one, never the
train split of one and the val split of the other. A kill between moving the previous set aside and moving the new
one in leaves no directory (never a mixed one); the next compaction puts the previous set back first (`recover`)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.common import SPLITS, PipelineError, atomic_path, dumps_json
from tasks.common.dvc_state import stat_key, state_md5s, state_put
from tasks.common.files import json_problem, read_json_strict, remove_dead_temporaries, restore_dead_aside
from tasks.common.model_errors import dotted, model_problems
from tasks.common.params import Project

DEFAULT_OUT = "data/compacted"
REPORT = "compaction.json"
MARKER = ".compaction"  # in every directory compaction wrote: what it wrote, which the next compaction may replace
MARKER_FORMAT = 1
MARKER_NOTE = "Written by `python -m tasks.curate.compact` (make compact): the next one replaces these files"
LEGACY_NOTE = "Written by `python -m tasks.curate.compact` (make compact): the next one replaces this directory\n"
MAX_MARKER_BYTES = 64 << 20  # ~100 bytes a shard
OWN = frozenset({MARKER, REPORT, *SPLITS})
OWNED_NAME = rf"^({REPORT.replace('.', '[.]')}|({'|'.join(SPLITS)})/[^./][^/]*[.]parquet)$"  # what compaction writes
OWNED = f"{REPORT} or <split>/<shard>.parquet (a split of {', '.join(SPLITS)}; no hidden name, no path)"
REMOVE = "move it out of the directory (compaction replaces the files it wrote), then compact again"


class WrittenFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    bytes: Annotated[int, Field(ge=0, le=2**63 - 1)] = Field(description="the file's size")
    md5: str = Field(pattern="^[0-9a-f]{32}$", description="32 lowercase hex digits (the file's MD5)")


class Marker(BaseModel):
    """MARKER: every file of the set compaction wrote (relative names), with its size and MD5."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format: Annotated[int, Field(ge=MARKER_FORMAT, le=MARKER_FORMAT, json_schema_extra={"const": MARKER_FORMAT})]
    note: str
    files: dict[Annotated[str, Field(pattern=OWNED_NAME, description=OWNED)], WrittenFile] = Field(
        description=f"a mapping of {REPORT} and <split>/<shard>.parquet to their bytes and md5"
    )


# params.yaml keys naming a source file or directory, and the words they take that name none
SOURCE_KEYS = (
    ("download", ("source", "train", "val", "devkit", "archive")),
    ("extract", ("folder", "classes", "val_labels", "catalog")),
    ("verify", ("checksums",)),
    ("curate", ("exclude", "relabel")),
)
KEYWORDS = frozenset({"sample", "auto", "official", "all", "imagenet100", "devkit", "derived"})
FIXED = (
    (".git", "the project's git repository"),
    (".dvc", "the project's DVC state and cache"),
    ("curation", "the curation files, the curate stage's input"),
)


def check_out(project: Project, out: str | Path) -> tuple[Path, dict[str, dict[str, int]]]:
    """`out` (relative: to the project) as an absolute path compaction may replace, with the files of it compaction
    wrote (`check_owned`), or PipelineError naming why not."""
    target = project.resolve(out).resolve()
    root = project.root.resolve()
    if target == root or not target.is_relative_to(root):
        raise PipelineError(
            f"compact --out: expected a directory inside the project {root} (e.g. {DEFAULT_OUT}, git-ignored), "
            f"found {target}; pass a path under the project"
        )
    for path, what in protected(project):
        if root.is_relative_to(path):
            continue  # a source directory holding the whole project (archives beside it): judged by the rest
        if target.is_relative_to(path) or path.is_relative_to(target):
            raise PipelineError(
                f"compact --out: expected a directory apart from {path} ({what}), found {target}; compaction "
                f"replaces its output whole: pass another directory, e.g. {DEFAULT_OUT}"
            )
    return target, check_owned(target)


def protected(project: Project) -> list[tuple[Path, str]]:
    """What compaction must never write over, inside or above: (absolute path, what it is), inputs first."""
    found = [(project.path(key), f"params.yaml paths.{key}, read by compaction") for key in ("parquet", "overlay")]
    found += [
        (project.path(key), f"params.yaml paths.{key}, a pipeline output")
        for key in project.paths
        if key not in ("parquet", "overlay")
    ]
    for section, keys in SOURCE_KEYS:
        for key in keys:
            value = getattr(getattr(project.params, section), key)
            if value and value not in KEYWORDS and ("://" not in value or value.startswith("file://")):
                found.append((project.resolve(value.removeprefix("file://")), f"params.yaml {section}.{key}, a source"))
    found += [(project.root / name, what) for name, what in FIXED]
    return [(path.resolve(), what) for path, what in found]


def check_owned(target: Path) -> dict[str, dict[str, int]]:
    """`target` is absent, an empty directory, or one compaction wrote, holding nothing but the files its MARKER
    lists, unchanged; returns them (relative name -> stat_key, as checked: `new_set` checks them again)."""
    if target.exists() and not target.is_dir():
        raise PipelineError(
            f"compact --out: expected a directory (compaction writes <out>/train, <out>/val), found {target}, a "
            f"file; pass a directory path, e.g. {DEFAULT_OUT}"
        )
    entries = sorted(p.name for p in target.iterdir()) if target.exists() else []
    if entries and MARKER not in entries:
        raise PipelineError(
            f"compact --out: expected a new or empty directory, or one compaction wrote before (holding {MARKER}), "
            f"found {target} holding {len(entries)} entries ({entries[0]}, ...) and no {MARKER}; compaction replaces "
            f"its output whole: pass a new directory, e.g. {DEFAULT_OUT}"
        )
    foreign = [name for name in entries if name not in OWN]
    if foreign:
        raise PipelineError(
            f"compact --out: expected only what compaction writes in {target} ({', '.join(sorted(OWN))}), found "
            f"{foreign[0]} too; move it out (the next compaction replaces the directory whole), then compact again"
        )
    if not entries:
        return {}
    listed = read_marker(target / MARKER).files
    found = _listing(target, listed)
    _same_md5s(target, {name: listed[name].md5 for name in found})
    return found


def read_marker(path: Path) -> Marker:
    """The MARKER at `path`, checked whole, or one PipelineError line."""
    what = f"expected the marker compaction writes (JSON, format {MARKER_FORMAT}: the files it wrote, each with "
    what += "its bytes and md5)"
    todo = f"move out what is yours, remove {path.parent} and compact again, or pass a new directory ({DEFAULT_OUT})"
    try:
        if path.is_symlink():
            raise ValueError("a symbolic link")
        doc = read_json_strict(path, MAX_MARKER_BYTES)
    except (OSError, ValueError) as err:
        found = json_problem(err)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path.read_text(encoding="utf-8") == LEGACY_NOTE:
                found = "the marker of an earlier compaction, which lists no files"
        raise PipelineError(f"{path}: {what}, found {found}; {todo}") from None
    try:
        return Marker.model_validate(doc)
    except ValidationError as err:
        problems = model_problems(Marker, err, dotted)
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    raise PipelineError(f"{path}: {what}, found {problems[0]}{more}; {todo}")


def _listing(target: Path, listed: dict[str, WrittenFile]) -> dict[str, dict[str, int]]:
    """Every file under `target` but MARKER, each listed with its size: relative name -> stat_key."""
    found = {}
    for split in sorted(set(SPLITS) & {p.name for p in target.iterdir()}):
        folder = target / split
        if folder.is_symlink() or not folder.is_dir():
            _refuse(target, split, "a file or link where compaction writes a folder")
        for entry in sorted(folder.iterdir()):
            found[f"{split}/{entry.name}"] = entry
    if (target / REPORT).exists() or (target / REPORT).is_symlink():
        found[REPORT] = target / REPORT
    stats = {}
    for name, entry in found.items():
        mode = entry.lstat().st_mode
        if name not in listed:
            _refuse(target, name, f"not listed in {MARKER}: not written by compaction")
        if not stat.S_ISREG(mode):
            _refuse(target, name, "a link, folder or special file where compaction wrote a file")
        if entry.stat().st_size != listed[name].bytes:
            _refuse(
                target,
                name,
                f"changed since compaction wrote it ({entry.stat().st_size:,} bytes, listed {listed[name].bytes:,})",
            )
        stats[name] = stat_key(entry)
    return stats


def _same_md5s(target: Path, md5s: dict[str, str]) -> None:
    """Each file holds its listed MD5: DVC's record of the file as it is now where it has one, else hashed."""
    known = state_md5s(target / name for name in md5s)
    for name, md5 in md5s.items():
        path = target / name
        found = known.get(str(path)) or _md5(path)
        if found != md5:
            _refuse(target, name, f"changed since compaction wrote it (md5 {found}, listed {md5})")


def _md5(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def _refuse(target: Path, name: str, found: str) -> None:
    raise PipelineError(
        f"compact --out: expected only the files compaction wrote in {target} (listed in its {MARKER}), unchanged, "
        f"found {name}: {found}; {REMOVE}"
    )


@dataclass
class NewSet:
    """A set being written (`new_set`): its temporary directory and the MD5 of every file written into it."""

    path: Path
    md5s: dict[str, str] = field(default_factory=dict)  # relative name -> MD5, as the writer hashed it

    def wrote(self, name: str, md5: str) -> None:
        self.md5s[name] = md5


@contextlib.contextmanager
def new_set(out: Path, owned: dict[str, dict[str, int]]) -> Iterator[NewSet]:
    """A fresh temporary sibling of `out` to write a whole set into (each file recorded with `NewSet.wrote`),
    published onto `out` as one directory when the block succeeds, with MARKER listing every file — after `out` is
    checked again to hold nothing but `owned` (`check_owned`'s files, unchanged since); removed when it fails.
    DVC's state learns the published files' MD5s (the next compaction's check reads none of them)."""
    with atomic_path(out) as tmp:
        tmp.mkdir()
        written = NewSet(tmp)
        yield written
        files = _marker_files(written)
        (tmp / MARKER).write_text(dumps_json({"format": MARKER_FORMAT, "note": MARKER_NOTE, "files": files}))
        if out.exists() or out.is_symlink():
            check_owned_again(out, owned)
    state_put((out / name, md5, stat_key(out / name)) for name, md5 in written.md5s.items())


def _marker_files(written: NewSet) -> dict[str, dict[str, object]]:
    on_disk = sorted(
        p.relative_to(written.path).as_posix() for p in written.path.rglob("*") if p.is_file() or p.is_symlink()
    )
    if on_disk != sorted(written.md5s):
        raise PipelineError(f"{written.path}: expected only the files compaction recorded, found {on_disk}")
    return {name: {"bytes": (written.path / name).stat().st_size, "md5": written.md5s[name]} for name in on_disk}


def check_owned_again(out: Path, owned: dict[str, dict[str, int]]) -> None:
    """`out` still holds nothing but `owned` (besides MARKER), each file unchanged since (size, mtime, inode)."""
    if out.is_symlink() or not out.is_dir():
        _refuse(out.parent, out.name, "put there while compaction ran")
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if name == MARKER or (path.is_dir() and not path.is_symlink()):
            continue
        if name not in owned or stat_key(path) != owned[name]:
            _refuse(out, name, "put there or changed while compaction ran")


def recover(out: Path) -> None:
    """After a killed compaction: the previous set put back where the kill left no `out` (else removed), and the
    dead run's temporary set removed (what the next atomic_path of `out` does first). A live run's are never
    touched."""
    restore_dead_aside(out)
    if out.parent.is_dir():
        remove_dead_temporaries(out.parent, glob.escape(out.name))

"""Where compaction (tasks/curate/compact.py) may write, and how it publishes a compacted set.

Compaction replaces its output directory whole, so it writes only into a directory it owns: a new one (absent or
empty) or one it wrote before (holding MARKER and nothing but what compaction writes). Never a source or an output
of the pipeline (every `paths:` entry, the source and table files params.yaml names, `curation/`, `.git`, `.dvc`),
nor inside or above one of them. A set (every split and compaction.json) is written under a temporary sibling and
published as one directory (tasks.common.atomic_path): a reader sees the previous set or the new one, never the
train split of one and the val split of the other. A kill between moving the previous set aside and moving the new
one in leaves no directory (never a mixed one); the next compaction puts the previous set back first (`recover`)."""

from __future__ import annotations

import contextlib
import glob
from collections.abc import Iterator
from pathlib import Path

from tasks.common import SPLITS, PipelineError, atomic_path
from tasks.common.files import remove_dead_temporaries, restore_dead_aside
from tasks.common.params import Project

DEFAULT_OUT = "data/compacted"
REPORT = "compaction.json"
MARKER = ".compaction"  # in every directory compaction wrote: the next compaction may replace it
MARKER_TEXT = "Written by `python -m tasks.curate.compact` (make compact): the next one replaces this directory\n"
OWN = frozenset({MARKER, REPORT, *SPLITS})
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


def check_out(project: Project, out: str | Path) -> Path:
    """`out` (relative: to the project) as an absolute path compaction may replace, or PipelineError naming why not."""
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
    check_owned(target)
    return target


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


def check_owned(target: Path) -> None:
    """`target` is absent, an empty directory, or one compaction wrote (MARKER, nothing else of another's)."""
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


@contextlib.contextmanager
def new_set(out: Path) -> Iterator[Path]:
    """A fresh temporary sibling of `out` (holding MARKER) to write a whole set into, published onto `out` as one
    directory when the block succeeds (tasks.common.atomic_path: the previous set moved aside, then removed),
    removed when it fails."""
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        yield tmp


def recover(out: Path) -> None:
    """After a killed compaction: the previous set put back where the kill left no `out` (else removed), and the
    dead run's temporary set removed (what the next atomic_path of `out` does first). A live run's are never
    touched."""
    restore_dead_aside(out)
    if out.parent.is_dir():
        remove_dead_temporaries(out.parent, glob.escape(out.name))

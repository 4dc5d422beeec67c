"""Class catalogs (wnid → words: the shipped ILSVRC2012 1000 in `data/synsets.tsv`, a supplied table, or the wnids
alone) and the rule every class name follows (any UTF-8 name that is one safe path component)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tasks.common.errors import PipelineError
from tasks.common.layout import DATA_DIR

WNID = re.compile(r"^n\d{8}$")
SYNSETS_TABLE = DATA_DIR / "synsets.tsv"
SHIPPED = "tasks/common/data/synsets.tsv"  # how the shipped table is named in messages and the extract report
UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")  # control characters, NUL and path separators (either OS's)


@dataclass(frozen=True)
class Synset:
    wnid: str
    words: str
    ilsvrc2012_id: int | None = None

    @property
    def first_synonym(self) -> str:
        return self.words.split(",")[0].strip()


def shipped_synsets(path: Path = SYNSETS_TABLE) -> dict[str, Synset]:
    """The 1000 ILSVRC2012 classes (wnid → Synset without IDs) from the table the project ships."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != "wnid\twords":
        raise PipelineError(f"{path}: expected a header 'wnid<TAB>words', found {lines[:1]}; restore the file")
    rows = (line.split("\t", 1) for line in lines[1:] if line)
    return {wnid: Synset(wnid, words) for wnid, words in rows}


def load_synsets() -> list[tuple[str, str]]:
    """(wnid, words) of the 1000 ILSVRC2012 classes, in wnid order, from the shipped table."""
    return [(s.wnid, s.words) for s in shipped_synsets().values()]


def class_name_problem(name: str) -> str | None:
    """Why `name` cannot be a class name — a single safe path component of valid UTF-8 — or None when it can.

    Spaces, dots, case and any non-ASCII letter are fine (the label is the name's place in sorted order)."""
    if name in ("", ".", ".."):
        return f"{name!r} (names no folder of its own)"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"{name.encode('utf-8', 'surrogateescape')!r} (not valid UTF-8)"
    if UNSAFE.search(name):
        return f"{name!r} (holds a path separator or a control character)"
    return None


@dataclass(frozen=True)
class Catalog:
    """Where a WordNet-named dataset's classes get their words: `synsets`, described in messages as `described`;
    `complete` False (extract.catalog: derived) accepts any wnid, with no words."""

    synsets: dict[str, Synset]
    name: str  # recorded in extract_report.json: the table's path, or "derived"
    described: str  # e.g. "the 1000 ILSVRC2012 classes in tasks/common/data/synsets.tsv"
    a_wnid: str  # what a class of it is, in messages: "an ILSVRC2012 wnid like n01440764"
    complete: bool = True

    def synset(self, wnid: str) -> Synset:
        return self.synsets.get(wnid) or Synset(wnid, "")


def shipped_catalog() -> Catalog:
    described = f"the 1000 ILSVRC2012 classes in {SHIPPED}"
    return Catalog(shipped_synsets(), SHIPPED, described, "an ILSVRC2012 wnid like n01440764")


DERIVED = Catalog({}, "derived", "the class names (extract.catalog: derived)", "a wnid like n01440764", False)


def read_catalog(path: Path, shown: str) -> Catalog:
    """A supplied `wnid<TAB>words` table (header `wnid<TAB>words` optional, blank lines ignored), every line
    checked: a malformed line or a repeated wnid fails naming `<file>:<line>`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise PipelineError(
            f"params.yaml extract.catalog: expected a wnid<TAB>words table, found {path} ({err}); "
            "fix the path, or set it to auto or derived"
        ) from None
    synsets: dict[str, Synset] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (number == 1 and line == "wnid\twords"):
            continue
        wnid, _, words = line.partition("\t")
        if not WNID.match(wnid) or wnid in synsets:
            found = f"{wnid!r} again" if wnid in synsets else repr(line[:80])
            raise PipelineError(
                f"{path}:{number}: expected wnid<TAB>words with a wnid like n01440764 once per table, found "
                f"{found}; fix the table (params.yaml extract.catalog)"
            )
        synsets[wnid] = Synset(wnid, words.strip())
    return Catalog(synsets, shown, f"the {len(synsets)} classes in {shown}", f"a wnid listed in {shown}")

"""The ILSVRC2012 class catalog the project ships (`data/synsets.tsv`): 1000 wnids with their words."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tasks.common.errors import PipelineError
from tasks.common.layout import DATA_DIR

WNID = re.compile(r"^n\d{8}$")
SYNSETS_TABLE = DATA_DIR / "synsets.tsv"


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

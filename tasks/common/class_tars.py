"""The per-class tars of a nested archive (ILSVRC2012's train archive, ImageNet-21k's one archive), checked as a
whole once they are indexed: a class tar without an image is reported (as folder mode reports an empty class
folder); a class in two or more tars (the same `<wnid>.tar` twice, or in two folders) is a reported merge — unless
an image name is in two of them: which copy is meant is then unknowable, and keeping one silently is not an option."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tasks.common.errors import PipelineError
from tasks.common.tarindex import printable, report


class _Named(Protocol):
    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ClassTar:
    """One `<wnid>.tar` of the archive: its member name and the slice of the index its images took."""

    wnid: str
    member: str
    start: int
    end: int


def class_tar_reports(
    archive: str, split: str, source: str, tars: list[ClassTar], entries: Sequence[_Named]
) -> list[dict[str, str]]:
    """extract_report.json entries for empty class tars and merged duplicates; PipelineError naming the archive
    when a duplicated class has an image name in two of its tars."""
    copies: dict[str, list[ClassTar]] = {}
    for tar in tars:
        copies.setdefault(tar.wnid, []).append(tar)
    reported = []
    for wnid, same in copies.items():
        images = sum(t.end - t.start for t in same)
        absent = f"class {wnid} counts as absent from {split}"
        for tar in (t for t in same if t.end == t.start):
            action = f"no image of class {wnid} from this copy" if images else absent
            reported.append(report(split, source, tar.member, "empty class tar (no images)", action))
        if len(same) > 1:
            _refuse_shared_names(archive, wnid, same, entries)
            members = " | ".join(t.member for t in same)
            why = f"class {wnid} in {len(same)} class tars (a duplicate <wnid>.tar)"
            merged = f"merged: the {images} images of all {len(same)} kept (no name in two of them)"
            reported.append(report(split, source, members, why, merged))
    return reported


def _refuse_shared_names(archive: str, wnid: str, same: list[ClassTar], entries: Sequence[_Named]) -> None:
    counts = Counter(name for t in same for name in {entries[i].name for i in range(t.start, t.end)})
    shared = sorted(name for name, n in counts.items() if n > 1)
    if shared:
        raise PipelineError(
            f"{archive}: expected each image of class {wnid} once, found {printable(shared[0])} in "
            f"{counts[shared[0]]} copies of {wnid}.tar ({' | '.join(printable(t.member) for t in same)}; "
            f"{len(shared)} name(s) in more than one copy, which one is meant is unknowable). Rebuild the archive "
            "to keep one copy of the class tar (or rename the images so that every copy is kept), then run "
            "`dvc repro` again"
        )

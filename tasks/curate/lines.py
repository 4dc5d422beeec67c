"""Curation as data: the exclude list and the relabel table (params.yaml `curate:`), read and checked for the
curate stage (tasks/curate/stage.py), which writes them as the overlay every reader applies.

`curation/exclude.csv` (header `split,wnid,name,reason`) drops images; `curation/relabel.csv` (header
`split,wnid,name,new_wnid,reason`) moves images to another class. `wnid` is the image's class as found in the
source (the folder name — any class name in folder mode —, the train tar, the val ground truth), `name` the
manifest `name`. `read_curation` checks the
files' form; `check_classes` the classes the lines leave; `curation_report` counts every applied line by reason
and class (`<paths.overlay>/curation.json`)."""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from tasks.common import SPLITS, PipelineError
from tasks.common.synsets import WNID, Catalog, class_name_problem

HEADERS = {"exclude": ["split", "wnid", "name", "reason"], "relabel": ["split", "wnid", "name", "new_wnid", "reason"]}


@dataclass(frozen=True)
class Line:
    """One curation line: where it is written, the image it names, and (relabel) the class it moves to."""

    where: str  # <file>:<line number>, the file as read (errors)
    split: str
    wnid: str
    name: str
    reason: str
    new_wnid: str | None
    at: str  # <file>:<line number>, the file as params.yaml names it (outputs: no checkout path)


@dataclass(frozen=True)
class Curation:
    files: dict[str, str | None] = field(default_factory=dict)  # exclude / relabel -> the file (None: none)
    exclude: tuple[Line, ...] = ()
    relabel: tuple[Line, ...] = ()


def read_curation(
    exclude: Path | None,
    relabel: Path | None,
    shown: dict[str, str | None] | None = None,
    catalog: Catalog | None = None,
) -> Curation:
    """Both files parsed and checked for form (header, split, class names — wnids of `catalog` when the source is
    known to be WordNet-named —, a reason, each image once); `shown`: the names recorded in the report (params.yaml's,
    relative: the report must not depend on the checkout's path)."""
    files = {"exclude": str(exclude) if exclude else None, "relabel": str(relabel) if relabel else None}
    shown = shown or files
    lines = {
        kind: _read(kind, path, shown[kind], catalog) for kind, path in (("exclude", exclude), ("relabel", relabel))
    }
    seen: dict[tuple[str, str, str], str] = {}
    for line in lines["exclude"] + lines["relabel"]:
        image = (line.split, line.wnid, line.name)
        if image in seen:
            fail(line.where, "each image once over both curation files", f"{image} again (first at {seen[image]})")
        seen[image] = line.where
    return Curation(shown, tuple(lines["exclude"]), tuple(lines["relabel"]))


def _read(kind: str, path: Path | None, shown: str | None, catalog: Catalog | None) -> list[Line]:
    if path is None:
        return []
    if not path.is_file():
        raise PipelineError(
            f"params.yaml curate.{kind}: expected a CSV with header {','.join(HEADERS[kind])}, found {path} (no "
            f"such file); create it (the header alone applies nothing) or set curate.{kind}: null"
        )
    rows = _rows(kind, path)
    if not rows or rows[0][1] != HEADERS[kind]:
        fail(f"{path}:1", f"the header {','.join(HEADERS[kind])}", repr(",".join(rows[0][1]) if rows else ""))
    return [
        _line(kind, f"{path}:{n}", f"{shown or path}:{n}", row, catalog) for n, row in rows[1:] if row
    ]  # an empty line is skipped; a line of empty fields (only commas) is refused by _line


def _rows(kind: str, path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every record; bytes that are not UTF-8 fail naming their line."""
    expected = f"a UTF-8 CSV with header {','.join(HEADERS[kind])} (params.yaml curate.{kind})"
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PipelineError(
            f"{path}: expected {expected}, found: {err}; fix the file or set curate.{kind}: null"
        ) from None
    try:
        text = data.decode("utf-8-sig")  # -sig: a BOM (spreadsheet exports) is no field
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        fail(f"{path}:{line}", expected, f"the bytes {data[err.start : err.end]!r} (not UTF-8); save it as UTF-8")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return [(reader.line_num, row) for row in reader]
    except csv.Error as err:
        fail(f"{path}:{reader.line_num}", expected, str(err))


def _line(kind: str, where: str, at: str, row: list[str], catalog: Catalog | None) -> Line:
    """One record (`where`: as read, for errors; `at`: as params.yaml names the file, for outputs). Fields are taken
    exactly as written — a class "cat " is not "cat" (ImageFolder keeps them apart) —, the free-text reason alone is
    stripped."""
    fields = HEADERS[kind]
    if len(row) != len(fields):
        fail(where, f"{len(fields)} fields ({','.join(fields)})", f"{len(row)}: {','.join(row)!r}")
    if not any(row):
        fail(where, f"a line {','.join(fields)}", f"{','.join(row)!r}, only empty fields; delete the line")
    values = dict(zip(fields, row, strict=True))
    if values["split"] not in SPLITS:
        fail(where, f"split one of {', '.join(SPLITS)}", repr(values["split"]))
    for key in ("wnid", "new_wnid"):
        name = values.get(key)
        problem = None if name is None else class_name_problem(name)
        if problem:
            fail(where, f"{key} a class name", problem)
    _check_classes(where, values.get("wnid"), values.get("new_wnid"), catalog)
    reason = values["reason"].strip()
    if not values["name"] or not reason:
        fail(where, "a name and a reason", f"{','.join(row)!r}")
    if values.get("new_wnid") == values["wnid"]:
        fail(where, "new_wnid other than wnid", repr(values["wnid"]))
    return Line(where, values["split"], values["wnid"], values["name"], reason, values.get("new_wnid"), at)


def _check_classes(where: str, wnid: str | None, new_wnid: str | None, catalog: Catalog | None) -> None:
    """With `catalog` (a WordNet-named source) both classes must be wnids of it."""
    for key, name in (("wnid", wnid), ("new_wnid", new_wnid)):
        if (
            catalog
            and name is not None
            and (not WNID.match(name) or (catalog.complete and name not in catalog.synsets))
        ):
            fail(where, f"{key} {catalog.a_wnid}", repr(name))


def fail(where: str, expected: str, found: str) -> NoReturn:
    raise PipelineError(f"{where}: expected {expected}, found {found}; fix the curation file (docs/CONTRACTS.md)")


def check_classes(
    curation: Curation, found: dict[str, dict[str, set[str]]], subset: list[str] | None, held: bool = False
) -> None:
    """The classes the lines leave, checked before the data is blamed (a relabel into a class outside the label
    source failed in stage.apply_lines): a relabel moves into a class the dataset keeps (never a silent drop), and no
    line leaves a class in one split only (unless `held`: val held out of train may lack a class anyway). `found`:
    per `before` / `after` the curation, split -> class names. A failure names the curation line."""
    for line in curation.relabel:
        if subset is not None and line.new_wnid not in subset:
            kept = "a class extract.classes keeps (the image would be dropped, not relabelled)"
            fail(line.where, f"new_wnid {kept}", f"{line.new_wnid!r}, not in the subset")
    if held:
        return
    before, after = found["before"], found["after"]
    wanted = set(subset) if subset is not None else after["train"] | after["val"]
    for split, other in zip(SPLITS, reversed(SPLITS), strict=True):
        for wnid in sorted(wanted - after[split]):
            _check_split_class(curation, split, other, wnid, before)


def _check_split_class(curation: Curation, split: str, other: str, wnid: str, before: dict[str, set[str]]) -> None:
    """`wnid`, kept by the dataset but missing from `split` after the curation: refused when lines emptied it
    there, or when only relabel lines bring it into `other`."""
    emptied = [x for x in curation.exclude + curation.relabel if (x.split, x.wnid) == (split, wnid)]
    if wnid in before[split] and emptied:
        fail(
            emptied[0].where,
            f"class {wnid} left with images in {split} (the dataset keeps it: {other} has it, or "
            "extract.classes lists it)",
            f"all {len(emptied)} of its {split} images excluded or relabelled away by the curation lines "
            "(this one first); keep one, or drop the class from both splits",
        )
    brought = [x for x in curation.relabel if (x.split, x.new_wnid) == (other, wnid)]
    if wnid not in before[other] and brought:
        fail(
            brought[0].where,
            f"new_wnid a class that {split} has too",
            f"{wnid!r}, which only relabel lines bring into {other}",
        )


def line_counts(lines: list[Line], moves: bool) -> dict[str, Any]:
    by_class = Counter(f"{line.wnid}->{line.new_wnid}" if moves else line.wnid for line in lines)
    return {"lines": len(lines), "by_reason": dict(Counter(line.reason for line in lines)), "by_class": dict(by_class)}


def curation_report(curation: Curation, counts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """extract_report.json `curation`: the files, and per kind and split the applied lines by reason and class."""
    return {
        "files": curation.files,
        **{kind: {split: counts[split][kind] for split in SPLITS} for kind in ("exclude", "relabel")},
        "applied": [
            {"kind": kind, "split": line.split, "wnid": line.wnid, "name": line.name, "new_wnid": line.new_wnid}
            for kind, lines in (("exclude", curation.exclude), ("relabel", curation.relabel))
            for line in lines
        ],
    }

"""Class-list files (`extract.classes`, `views.<name>.classes`): a named subset the project ships
(`imagenet100`) or a file of one class per line, read by one rule wherever a stage takes a class list."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.common import DATA_DIR, PipelineError
from tasks.common.params import resolve_path
from tasks.common.synsets import WNID, Catalog, class_name_problem

SUBSETS = {"imagenet100": DATA_DIR / "imagenet100_cmc.txt"}  # named subsets the project ships


def read_class_list(
    spec: str | os.PathLike[str] | None,
    root: Path = Path("."),
    catalog: Catalog | None = None,
    key: str = "extract.classes",
) -> list[str] | None:
    """`all` (or None) → None; `imagenet100` → the shipped CMC list; else a file of one class name per line (a
    relative path against `root`, the project).

    Blank lines and `#` comments (a line starting with `#`, or ` #` after a name) are ignored. With `catalog` (a
    WordNet-named source) every name must be a wnid of it (spaces around it ignored); without (folder mode) any
    class name, compared exactly: `cat ` is another folder than `cat`, as for ImageFolder and the curation files
    (spaces before a ` #` comment are the comment's). A bad or repeated
    name fails naming the line — before any archive is scanned."""
    if spec is None or str(spec) == "all":
        return None
    path = SUBSETS.get(str(spec), resolve_path(root, spec))
    if not path.is_file():
        raise PipelineError(
            f"params.yaml {key}: expected all, {', '.join(SUBSETS)} or a file of "
            f"class names, found {str(spec)!r} (no such file); fix the parameter"
        )
    names: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = _listed_name(line, catalog is not None)
        problem = _list_problem(text, names, catalog) if text else None
        if problem:
            raise PipelineError(
                f"{path}:{number}: expected one {'wnid' if catalog else 'class name'} per line, found {text!r} "
                f"({problem}); fix the class list"
            )
        names += [text] if text else []
    if not names:
        raise PipelineError(f"{path}: expected at least one class, found none; fix the class list")
    return sorted(names)


def _listed_name(line: str, wnids: bool) -> str:
    """The class a class-list line names ("" for none): before a ` #` comment (the spaces before it dropped); a
    wnid with the spaces around it dropped; a folder name exactly as written (`cat ` is not `cat`)."""
    if line.lstrip().startswith("#") or not line.strip():
        return ""
    text = line.split(" #", 1)[0].rstrip() if " #" in line else line
    return text.strip() if wnids else text


def _list_problem(text: str, listed: list[str], catalog: Catalog | None) -> str | None:
    if text in listed:
        return "a repeated class"
    if catalog is None:
        return class_name_problem(text)
    if not WNID.match(text):
        return "not a wnid like n01440764"
    return None if text in catalog.synsets or not catalog.complete else f"not one of {catalog.described}"

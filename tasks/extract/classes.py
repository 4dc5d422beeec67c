"""Class catalog, class subsets and the label map shared by train and val (sorted-wnid order)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.common import DATA_DIR, PipelineError
from tasks.common.params import resolve_path
from tasks.common.synsets import WNID, Synset, shipped_synsets

SUBSETS = {"imagenet100": DATA_DIR / "imagenet100_cmc.txt"}  # named subsets the project ships


def unique_names(catalog: dict[str, Synset]) -> dict[str, str]:
    """wnid → label name: the first synonym, plus ` (<wnid>)` when that synonym names two leaf synsets.

    Duplicates are judged over the full 1000 (the shipped table together with `catalog`), so a class keeps
    the same name whatever subset is selected (e.g. both cranes are `crane (n02012849)`, `crane (n03126707)`)."""
    everyone = {**shipped_synsets(), **catalog}
    counts = Counter(s.first_synonym for s in everyone.values())
    return {
        wnid: s.first_synonym + (f" ({wnid})" if counts[s.first_synonym] > 1 else "") for wnid, s in catalog.items()
    }


def read_class_list(spec: str | os.PathLike[str] | None, root: Path = Path(".")) -> list[str] | None:
    """`all` (or None) → None; `imagenet100` → the shipped CMC list; else a file of one wnid per line (a relative
    path against `root`, the project).

    Blank lines and `#` comments are ignored; a malformed, repeated or unknown wnid (not one of the 1000 ILSVRC2012
    classes of tasks/common/data/synsets.tsv) fails naming the line — before any archive is scanned."""
    if spec is None or str(spec) == "all":
        return None
    path = SUBSETS.get(str(spec), resolve_path(root, spec))
    if not path.is_file():
        raise PipelineError(
            f"params.yaml extract.classes: expected all, {', '.join(SUBSETS)} or a file of "
            f"wnids, found {str(spec)!r} (no such file); fix the parameter"
        )
    wnids: list[str] = []
    known = shipped_synsets()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not WNID.match(text) or text in wnids or text not in known:
            problem = "a repeated wnid" if text in wnids else "not a wnid like n01440764"
            if WNID.match(text) and text not in wnids:
                problem = "not one of the 1000 ILSVRC2012 classes in tasks/common/data/synsets.tsv"
            raise PipelineError(
                f"{path}:{number}: expected one wnid per line, found {text!r} ({problem}); fix the class list"
            )
        wnids.append(text)
    if not wnids:
        raise PipelineError(f"{path}: expected at least one wnid, found none; fix the class list")
    return sorted(wnids)


def _listing(wnids: set[str] | list[str], limit: int = 20) -> str:
    items = sorted(wnids)
    more = f" … ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_known(wnids: set[str], catalog: dict[str, Synset], where: str, catalog_name: str) -> None:
    """Every wnid found in the data must be a class of the catalog (devkit leaves or shipped synsets)."""
    unknown = wnids - set(catalog)
    if unknown:
        raise PipelineError(
            f"{where}: expected classes listed in {catalog_name}, found {len(unknown)} unknown "
            f"wnid(s): {_listing(unknown)}; fix the data or the label source"
        )


def select_classes(
    train: set[str], val: set[str], subset: list[str] | None, train_where: str, val_where: str
) -> list[str]:
    """The sorted classes to keep: all of train (= val), or the subset (which both splits must contain)."""
    if subset is not None:
        missing = {"train": set(subset) - train, "val": set(subset) - val}
        for split, where in (("train", train_where), ("val", val_where)):
            if missing[split]:
                raise PipelineError(
                    f"{where}: expected every class of extract.classes in {split}, missing "
                    f"{len(missing[split])}: {_listing(missing[split])}; choose another subset"
                )
        return sorted(subset)
    if not train and not val:
        raise PipelineError(
            f"{train_where}, {val_where}: expected images of at least one class, found none; "
            "check the input (skipped files are listed in the log)"
        )
    if train != val:
        raise PipelineError(
            f"{train_where} vs {val_where}: expected the same classes in train and val, found "
            f"{len(train - val)} only in train ({_listing(train - val)}) and {len(val - train)} only in val "
            f"({_listing(val - train)}); fix the data or select a common subset with extract.classes"
        )
    return sorted(train)


def label_map(wnids: list[str], catalog: dict[str, Synset], label_source: str) -> dict[str, Any]:
    """The label map (docs/CONTRACTS.md): label = position of the wnid in sorted order, 0..K-1."""
    names = unique_names(catalog)
    classes = [
        {
            "label": label,
            "wnid": wnid,
            "name": names[wnid],
            "words": catalog[wnid].words,
            "ilsvrc2012_id": catalog[wnid].ilsvrc2012_id,
        }
        for label, wnid in enumerate(sorted(wnids))
    ]
    return {"num_classes": len(classes), "label_source": label_source, "classes": classes}

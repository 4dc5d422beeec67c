"""Class subsets, the catalog check and the label map shared by train and val (sorted class names → 0..K-1).

A dataset is WordNet-named when every class name is a wnid: its label map carries the wnid and the catalog's
words. Any other dataset is named: `wnid`, `words` and `ilsvrc2012_id` are null and `name` is the folder name.
Either way labels are the positions of the class names in Python's sorted order — torchvision ImageFolder's
`sorted(entry.name for entry in os.scandir(root) if entry.is_dir())`."""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.common import DATA_DIR, PipelineError
from tasks.common.params import resolve_path
from tasks.common.synsets import (
    DERIVED,
    WNID,
    Catalog,
    Synset,
    class_name_problem,
    read_catalog,
    shipped_catalog,
    shipped_synsets,
)

SUBSETS = {"imagenet100": DATA_DIR / "imagenet100_cmc.txt"}  # named subsets the project ships


def unique_names(catalog: dict[str, Synset]) -> dict[str, str]:
    """wnid → label name: the first synonym, plus ` (<wnid>)` when that synonym names two leaf synsets (the wnid
    alone when the catalog has no words for it).

    Duplicates are judged over the full 1000 (the shipped table together with `catalog`), so a class keeps
    the same name whatever subset is selected (e.g. both cranes are `crane (n02012849)`, `crane (n03126707)`)."""
    everyone = {**shipped_synsets(), **catalog}
    counts = Counter(s.first_synonym for s in everyone.values())
    return {
        wnid: (s.first_synonym + (f" ({wnid})" if counts[s.first_synonym] > 1 else "")) if s.first_synonym else wnid
        for wnid, s in catalog.items()
    }


def read_class_list(
    spec: str | os.PathLike[str] | None, root: Path = Path("."), catalog: Catalog | None = None
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
            f"params.yaml extract.classes: expected all, {', '.join(SUBSETS)} or a file of "
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


def _listing(wnids: set[str] | list[str], limit: int = 20) -> str:
    items = sorted(wnids)
    more = f" … ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_known(wnids: set[str], catalog: Catalog, where: str) -> None:
    """Every wnid found in the data must be a class of the catalog (devkit leaves, shipped or supplied table)."""
    unknown = wnids - set(catalog.synsets) if catalog.complete else set()
    if unknown:
        raise PipelineError(
            f"{where}: expected classes listed in {catalog.name}, found {len(unknown)} unknown "
            f"wnid(s): {_listing(unknown)}; fix the data or the label source (params.yaml extract.catalog: a "
            "wnid<TAB>words table, or derived for the wnids alone)"
        )


def select_classes(
    train: set[str], val: set[str], subset: list[str] | None, train_where: str, val_where: str, held: bool = False
) -> list[str]:
    """The sorted classes to keep: all of train (= val), or the subset (which both splits must contain); `held`
    (val held out of train): the classes of either split, a subset those of train and val together."""
    if held:
        train = val = train | val
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
            f"({_listing(val - train)}){_lookalike_hint(train - val, val - train)}; fix the data or select a common "
            "subset with extract.classes"
        )
    return sorted(train)


def _lookalike_hint(train: set[str], val: set[str]) -> str:
    """A note when names found in one split only differ from the other's only in Unicode normalization."""
    nfc = {unicodedata.normalize("NFC", name): name for name in val}
    pairs = [(name, nfc[key]) for name in sorted(train) if (key := unicodedata.normalize("NFC", name)) in nfc]
    if not pairs:
        return ""
    train_name, val_name = pairs[0]
    return (
        f"; {len(pairs)} of them differ only in Unicode normalization (e.g. train {train_name!a} vs val "
        f"{val_name!a}: composed vs decomposed accents): rename the folders to one spelling"
    )


def label_map(classes: list[str], catalog: Catalog | None, label_source: str) -> dict[str, Any]:
    """The label map (docs/CONTRACTS.md): label = position of the class name in sorted order, 0..K-1; WordNet
    names (`catalog` given) carry their wnid, words and ILSVRC2012 id, other names none of them."""
    ordered = sorted(classes)
    if catalog is None:
        entries: list[dict[str, Any]] = [
            {"wnid": None, "name": name, "words": None, "ilsvrc2012_id": None} for name in ordered
        ]
    else:
        synsets = {wnid: catalog.synset(wnid) for wnid in ordered}
        names = unique_names({**catalog.synsets, **synsets})  # duplicates judged over the whole catalog
        entries = [
            {"wnid": w, "name": names[w], "words": s.words, "ilsvrc2012_id": s.ilsvrc2012_id}
            for w, s in synsets.items()
        ]
    listed = [{"label": label, **entry} for label, entry in enumerate(entries)]
    return {"num_classes": len(listed), "label_source": label_source, "classes": listed}


def catalog_of(spec: str, root: Path) -> Catalog | None:
    """params.yaml extract.catalog as a catalog: a table read now (so a bad one fails before any scan), `derived`,
    or None for `auto` (the stage's own: the devkit in archives mode, the shipped 1000 in folder mode)."""
    if spec == "auto":
        return None
    if spec == "derived":
        return DERIVED
    return read_catalog(resolve_path(root, spec), spec)


def folder_catalog(found: set[str], spec: str, root: Path) -> Catalog | None:
    """Folder mode: the catalog of a tree whose class folders are all wnids (the supplied table, the wnids alone,
    or the shipped 1000), None for a tree of other names — whose label map then carries no wnid."""
    if found and all(WNID.match(name) for name in found):
        return catalog_of(spec, root) or shipped_catalog()
    if spec != "auto":
        other = sorted(name for name in found if not WNID.match(name))[:3]
        raise PipelineError(
            f"params.yaml extract.catalog: expected auto for class folders not named by wnid, found {spec!r} "
            f"while the tree holds e.g. {other}; set extract.catalog: auto (the folder names are the classes)"
        )
    return None

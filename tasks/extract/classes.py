"""Class subsets, the catalog check and the label map shared by train and val (sorted class names → 0..K-1).

A dataset is WordNet-named when every class name is a wnid: its label map carries the wnid and the catalog's
words. Any other dataset is named: `wnid`, `words` and `ilsvrc2012_id` are null and `name` is the folder name.
Either way labels are the positions of the class names in Python's sorted order — torchvision ImageFolder's
`sorted(entry.name for entry in os.scandir(root) if entry.is_dir())`."""

from __future__ import annotations

import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.common import PipelineError
from tasks.common.params import resolve_path
from tasks.common.synsets import (
    DERIVED,
    WNID,
    Catalog,
    Synset,
    read_catalog,
    shipped_catalog,
    shipped_synsets,
)


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

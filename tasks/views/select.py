"""A view of one split: which rows it keeps and the labels it gives them (contract C4).

keep = the base overlay's keep AND the view's classes AND every `where` condition AND (near_duplicates: drop) not
a listed near-duplicate; labels are the positions of the rows' classes in the view's sorted class list (-1 for a
row of another class). Pure: arrays in, arrays out."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.common import PipelineError
from tasks.common.params import ViewCondition
from tasks.views.base import BaseSplit
from tasks.views.spec import PATH_COLUMN, key


@dataclass(frozen=True)
class Selection:
    """A view of a split: per row of the base the view's label and keep flag; how many rows each step left."""

    labels: np.ndarray
    keep: np.ndarray
    steps: dict[str, int]


def view_labels(base: BaseSplit, classes: list[int]) -> np.ndarray:
    """Per row, its class's position among the view's `classes` (base labels in view order), else -1."""
    lookup = np.full(len(base.label_map["classes"]) + 1, -1, dtype=np.int64)  # last slot: label -1 stays -1
    lookup[np.asarray(classes, dtype=np.int64)] = np.arange(len(classes), dtype=np.int64)
    labels: np.ndarray = lookup[base.labels]
    return labels


def condition_mask(base: BaseSplit, condition: ViewCondition) -> np.ndarray:
    """Rows whose `condition.column` passes every operator given (a null value passes none)."""
    column = base.column(condition.column)
    mask = pa.array(np.ones(len(column), dtype=bool))
    if condition.glob is not None:
        mask = pc.and_(mask, _glob(column, condition.glob))
    if condition.min is not None:
        mask = pc.and_(mask, pc.greater_equal(column, pa.scalar(condition.min)))
    if condition.max is not None:
        mask = pc.and_(mask, pc.less_equal(column, pa.scalar(condition.max)))
    if condition.in_ is not None:
        mask = pc.and_(mask, pc.is_in(column, value_set=pa.array(condition.in_, column.type)))
    passed: np.ndarray = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    return passed


def _glob(column: pa.Array, pattern: str) -> pa.Array:
    """Rows whose text matches the shell pattern (fnmatch, case-sensitive), judged once per distinct value."""
    match = re.compile(fnmatch.translate(pattern)).match
    values = pc.unique(column).to_pylist()
    hits = pa.array(sorted(v for v in values if v is not None and match(v)), pa.string())
    return pc.is_in(column, value_set=hits)


def near_duplicate_mask(base: BaseSplit, listed: set[tuple[str, str, str]]) -> np.ndarray:
    """Rows validate lists as near-duplicates (split, class id, image name) — the curated class."""
    wanted = sorted({name for split, _, name in listed if split == base.split})
    names = base.column(PATH_COLUMN)
    rows = np.flatnonzero(pc.is_in(names, value_set=pa.array(wanted, pa.string())).to_numpy(zero_copy_only=False))
    mask = np.zeros(len(names), dtype=bool)
    ids = base.ids
    for row, name in zip(rows, names.take(pa.array(rows, pa.int64())).to_pylist(), strict=True):
        label = int(base.labels[row])
        mask[row] = label >= 0 and (base.split, ids[label], name) in listed
    return mask


def select(
    name: str, base: BaseSplit, classes: list[int], where: list[ViewCondition], near: set[tuple[str, str, str]] | None
) -> Selection:
    """The view `name` of `base`: its labels and keep flags; a view that keeps no row fails naming the key."""
    labels = view_labels(base, classes)
    keep = base.keep & (labels >= 0)
    steps = {"curated": int(base.keep.sum()), "classes": int(keep.sum())}
    for index, condition in enumerate(where):
        keep &= condition_mask(base, condition)
        steps[f"where[{index}]"] = int(keep.sum())
    if near is not None:
        keep &= ~near_duplicate_mask(base, near)
        steps["near_duplicates"] = int(keep.sum())
    if not keep.any():
        counts = ", ".join(f"{step} {count}" for step, count in steps.items())
        raise PipelineError(
            f"params.yaml {key(name)}: expected rows of {base.split} in the view, found none (rows left after each "
            f"step: {counts}); widen its classes or where, or list fewer splits"
        )
    return Selection(labels, keep, steps)


def view_label_map(base: BaseSplit, classes: list[int]) -> dict[str, Any]:
    """The view's label map: its classes (entries of the base map, words and names kept) relabelled 0..K-1."""
    entries = [{**base.label_map["classes"][label], "label": i} for i, label in enumerate(classes)]
    rest = {k: v for k, v in base.label_map.items() if k not in ("classes", "num_classes")}
    return {**rest, "num_classes": len(entries), "classes": entries}

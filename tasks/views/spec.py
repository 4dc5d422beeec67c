"""A view's spec checked before any shard is read: its `where` columns against the shard schema, its class list
read (a named subset, a file under curation/, or inline), and its classes resolved against the dataset's.

Columns a condition may name: the shards' metadata columns (`imagenet_parquet.format.FIELDS` but the image bytes),
`path` for the image name (`image.path`); `label`, `wnid` and `label_name` are the curated class (the base
overlay's label), as every reader gives them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from imagenet_parquet.format import FIELDS, FINGERPRINT_COLUMN
from tasks.common import PipelineError
from tasks.common.class_lists import SUBSETS, read_class_list
from tasks.common.params import ViewCondition, ViewSpec, resolve_path

PATH_COLUMN = "path"  # the image name: the shards' `image.path`
CLASS_COLUMNS = ("label", "wnid", "label_name")  # derived from the curated label, not the label as converted
COLUMN_TYPES: dict[str, pa.DataType] = {
    PATH_COLUMN: pa.string(),
    **{name: dtype for name, dtype in FIELDS if name != "image"},
}


def key(name: str, *rest: str | int) -> str:
    """The params.yaml key of a view's setting, as messages name it: `views.mine.where[0].column`."""
    text = f"views.{name}"
    for part in rest:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def is_text(column: str) -> bool:
    return bool(pa.types.is_string(COLUMN_TYPES[column]))


def check_where(name: str, spec: ViewSpec) -> None:
    """Every condition names a column the shards carry, with operators that fit its type (text: glob, in;
    numbers: min, max, in)."""
    for index, condition in enumerate(spec.where):
        where = key(name, "where", index)
        if condition.column not in COLUMN_TYPES:
            raise PipelineError(
                f"params.yaml {where}.column: expected a metadata column of the shards ({', '.join(COLUMN_TYPES)}), "
                f"found {condition.column!r}; fix the view"
            )
        problem = _operator_problem(condition)
        if problem:
            raise PipelineError(f"params.yaml {where}: expected {problem}; fix the view")


def _operator_problem(condition: ViewCondition) -> str | None:
    column, text = condition.column, is_text(condition.column)
    if text and (condition.min is not None or condition.max is not None):
        return f"glob or in on the text column {column}, found min/max"
    if not text and condition.glob is not None:
        return f"min, max or in on the numeric column {column}, found glob"
    if any(isinstance(v, int) and not _fits(v, pa.int64()) for v in (condition.min, condition.max)):
        return f"min and max within 64-bit integers for column {column}, found min {condition.min}, max {condition.max}"
    if column == FINGERPRINT_COLUMN and (condition.min is not None or condition.max is not None):
        return f"in on {column} (a fingerprint: its values have no order), found min/max"
    values = condition.in_ or []
    wrong = [v for v in values if isinstance(v, str) != text or (not text and not _fits(v, COLUMN_TYPES[column]))]
    if wrong:
        kind = "text" if text else f"integer ({COLUMN_TYPES[column]})"
        return f"in: {kind} values of column {column}, found {wrong[0]!r}"
    return None


def _fits(value: object, dtype: pa.DataType) -> bool:
    """An integer value the integer column can hold (a wider one would match no row, and Arrow refuses it)."""
    if not isinstance(value, int):
        return False
    bounds = np.iinfo(dtype.to_pandas_dtype())
    return bool(bounds.min <= value <= bounds.max)


@dataclass(frozen=True)
class ClassList:
    """What `classes:` asks for: None (all), or class ids with where they were read (a file, or the params key)."""

    ids: list[str] | None
    where: str


def read_classes(name: str, spec: ViewSpec, root: Path) -> ClassList:
    """The class ids a view asks for, read now by the rule of every class list (tasks/common/class_lists.py: the
    same file `extract.classes: imagenet100` reads); a bad file fails before any shard is read."""
    where = key(name, "classes")
    if isinstance(spec.classes, list):
        return ClassList(sorted(spec.classes), f"params.yaml {where}")
    ids = read_class_list(spec.classes, root, key=where)
    if ids is None:
        return ClassList(None, f"params.yaml {where}")
    return ClassList(ids, str(SUBSETS.get(spec.classes) or resolve_path(root, spec.classes)))


def resolve_classes(name: str, wanted: ClassList, ids: list[str]) -> list[int]:
    """The base labels of the view's classes, in the view's order (sorted class ids); a class the dataset lacks
    fails naming the key."""
    index = {class_id: label for label, class_id in enumerate(ids)}
    if wanted.ids is None:
        return [index[class_id] for class_id in sorted(ids)]
    unknown = [class_id for class_id in wanted.ids if class_id not in index]
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:5]) + (f" … ({len(unknown) - 5} more)" if len(unknown) > 5 else "")
        raise PipelineError(
            f"params.yaml {key(name, 'classes')}: expected classes of the dataset ({len(ids)} in the curated label "
            f"map, e.g. {ids[0]!r}), found {len(unknown)} it lacks: {shown} (from {wanted.where}); fix the view"
        )
    return [index[class_id] for class_id in wanted.ids]

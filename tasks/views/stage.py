"""Views stage: the named subsets of params.yaml `views:` as small overlay-shaped files beside the overlay — no
shard is written (docs/CONTRACTS.md; design contract C4).

`job_from_params` checks every view before any shard is read (its columns against the shard schema, its class
list read); `write_views` reads each split's base overlay and its shards' metadata columns once, and publishes
`<paths.views>/<name>/<split>.parquet` (overlay format 2: keep and labels of the view, its `label_map`, `view`,
`base_overlay_sha256`, `spec`) and `views.json` (per view: classes, rows and kept image bytes per split) as one
directory: a view removed from params.yaml is gone with the previous directory."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from imagenet_parquet.overlay import overlay_table, write_overlay
from tasks.common import SPLITS, PipelineError, atomic_path, write_json
from tasks.common.params import Project, ViewSpec, path_key
from tasks.views import spec as specs
from tasks.views.base import BaseSplit, read_base
from tasks.views.select import select, view_label_map

VIEWS_REPORT = "views.json"  # under paths.views
NEAR_DUPLICATES_CSV = "near_duplicates_exclude.csv"  # validate's, under paths.reports (split,wnid,name,reason)
VIEWS_FORMAT = 1


@dataclass(frozen=True)
class ViewsJob:
    parquet: Path
    overlay: Path
    label_map: Path
    views_dir: Path
    views: dict[str, ViewSpec]
    classes: dict[str, specs.ClassList]
    near_duplicates: set[tuple[str, str, str]] | None  # None: no view drops them


def job_from_params(project: Project) -> ViewsJob:
    """The job; a bad column, operator or class list fails now, naming the params key or the file's line."""
    views = dict(sorted(project.params.views.items()))
    for name, view in views.items():
        specs.check_where(name, view)
    classes = {name: specs.read_classes(name, view, project.root) for name, view in views.items()}
    dropping = any(view.near_duplicates == "drop" for view in views.values())
    near = read_near_duplicates(project.path("reports") / NEAR_DUPLICATES_CSV) if dropping else None
    path = project.path
    return ViewsJob(path("parquet"), path("overlay"), path("label_map"), path("views"), views, classes, near)


def read_near_duplicates(path: Path) -> set[tuple[str, str, str]]:
    """(split, class id, name) of every image validate's near_duplicates_exclude.csv lists."""
    if not path.is_file():
        raise PipelineError(
            f"{path}: expected the near-duplicate list the validate stage writes (a view has near_duplicates: drop), "
            "found no file; run `dvc repro validate` (or `dvc pull` it)"
        )
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    if not rows or rows[0][:3] != ["split", "wnid", "name"]:
        raise PipelineError(f"{path}: expected the header split,wnid,name,reason, found {rows[:1]}; run validate again")
    return {(row[0], row[1], row[2]) for row in rows[1:] if len(row) >= 3}


def _columns(views: dict[str, ViewSpec], split: str) -> set[str]:
    """The metadata columns the views of `split` read (the image name too when one drops near-duplicates)."""
    wanted = {c.column for view in views.values() if split in view.splits for c in view.where}
    dropping = any(view.near_duplicates == "drop" and split in view.splits for view in views.values())
    return wanted | ({specs.PATH_COLUMN} if dropping else set())


def view_table(
    name: str, view: ViewSpec, wanted: specs.ClassList, base: BaseSplit, job: ViewsJob
) -> tuple[pa.Table, dict[str, Any]]:
    """The view file of one split (overlay format 2 over all the split's shards), and what views.json says of it."""
    classes = specs.resolve_classes(name, wanted, base.ids)
    near = job.near_duplicates if view.near_duplicates == "drop" else None
    chosen = select(name, base, classes, view.where, near)
    extra = {
        "view": name,
        "base_overlay_sha256": base.digest,
        "spec": view.model_dump(mode="json", by_alias=True, exclude_none=True),
        "rows": int(chosen.keep.sum()),
        "image_bytes": int(base.image_bytes[chosen.keep].sum()),
        "steps": chosen.steps,
    }
    lmap = view_label_map(base, classes)
    summary = {"classes": [base.ids[label] for label in classes], **extra}
    return overlay_table(base.split, base.shards, chosen.labels, chosen.keep, extra, label_map=lmap), summary


def write_views(job: ViewsJob) -> dict[str, Any]:
    """Every view of every split, and views.json, published as one directory; returns views.json's content."""
    tables: dict[tuple[str, str], pa.Table] = {}
    report: dict[str, Any] = {name: {"splits": {}} for name in job.views}
    for split in SPLITS:
        if not any(split in view.splits for view in job.views.values()):
            continue
        base = read_base(job.parquet, job.overlay, job.label_map, split, _columns(job.views, split))
        for name, view in job.views.items():
            if split in view.splits:
                tables[name, split], summary = view_table(name, view, job.classes[name], base, job)
                report[name] = _entry(report[name], split, summary)
    with atomic_path(job.views_dir, path_key("views")) as tmp:  # whole: a view gone from params.yaml goes too
        tmp.mkdir()
        for (name, split), table in sorted(tables.items()):
            (tmp / name).mkdir(exist_ok=True)
            write_overlay(table, tmp / name / f"{split}.parquet")
        write_json(tmp / VIEWS_REPORT, {"format": VIEWS_FORMAT, "views": report})
    return report


def _entry(entry: dict[str, Any], split: str, summary: dict[str, Any]) -> dict[str, Any]:
    """A view's views.json entry with one more split: classes, spec, and per split rows, image bytes, steps."""
    splits = {**entry["splits"], split: {k: summary[k] for k in ("rows", "image_bytes", "steps")}}
    return {"classes": summary["classes"], "spec": summary["spec"], "splits": splits}

"""Curate stage: the curation lines (params.yaml `curate:`) as the overlay every reader applies — the shards are
never rewritten for them (docs/CONTRACTS.md, "Curation overlay").

`job_from_params` reads and checks both files (their form, before any shard is read); `write_overlays` reads each
split's shards once — the footer, the image names and the labels as converted, never an image byte —, finds the
image each line names (`<file>:<line>` fails when the source has no such image), checks the classes the lines
leave (`lines.check_classes`), and writes `<paths.overlay>/<split>.parquet` (imagenet_parquet/overlay.py) and
`curation.json` (what was applied, by reason and class)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imagenet_parquet.format import class_ids, read_label_map
from imagenet_parquet.overlay import footer_digest, footer_tail, overlay_table, write_overlay
from tasks.common import SPLITS, PipelineError, atomic_path, write_json
from tasks.common.layout import CURATION_REPORT, EXTRACT_REPORT
from tasks.common.manifests import manifest_path
from tasks.common.params import CURATION_DIR, Project, path_key
from tasks.curate import lines as curation_lines
from tasks.curate.lines import Curation, Line

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CurateJob:
    parquet: Path
    manifests: Path
    label_map: Path
    overlay: Path
    curation: Curation


@dataclass
class SplitRows:
    """A split's shards as converted: [(name, rows, footer sha256)], every row's image name and label."""

    shards: list[tuple[str, int, str]]
    names: pa.Array
    labels: np.ndarray


def job_from_params(project: Project) -> CurateJob:
    """The job; a malformed curation file fails now, naming its line."""
    cur = project.params.curate
    curation = curation_lines.read_curation(
        _tracked(project, "exclude", cur.exclude),
        _tracked(project, "relabel", cur.relabel),
        {"exclude": cur.exclude, "relabel": cur.relabel},
    )
    path = project.path
    return CurateJob(path("parquet"), path("manifests"), path("label_map"), path("overlay"), curation)


def _tracked(project: Project, key: str, value: str | None) -> Path | None:
    """A curation file (under curation/: the params model checks the path) that is not a link out of curation/: git
    would hold the link, not the lines (another checkout curates with whatever the link finds there, or fails)."""
    if value is None:
        return None
    path, inside = project.resolve(value), (project.root / CURATION_DIR).resolve()
    if path.exists() and not path.resolve().is_relative_to(inside):
        raise PipelineError(
            f"params.yaml curate.{key}: expected a file inside {CURATION_DIR}/ (the curate stage's dependency), found "
            f"{value} linking to {path.resolve()}; copy the file into {CURATION_DIR}/ in place of the link"
        )
    return path


def read_split(parquet: Path, split: str) -> SplitRows:
    """The shards of `split` in name order (as readers sort them): footer digest, names and labels of every row."""
    files = sorted((parquet / split).glob("*.parquet"))
    if not files:
        raise PipelineError(
            f"{parquet / split}: expected the {split} shards written by the convert stage, found none; run "
            "`dvc repro convert`"
        )
    shards, names, labels = [], [], []
    for path in files:
        file = pq.ParquetFile(path)
        table = file.read(columns=["image.path", "label"], use_threads=False)
        shards.append((path.name, file.metadata.num_rows, footer_digest(footer_tail(path))))
        names.append(table.column("image").combine_chunks().field("path"))
        labels.append(table.column("label").to_numpy())
    return SplitRows(shards, pa.concat_arrays(names), np.concatenate(labels).astype(np.int64))


def _positions(rows: SplitRows, ids: list[str], lines: list[Line]) -> dict[tuple[str, str], int]:
    """(class, name) -> global row, for the rows whose name a line names only (no Python object per row)."""
    wanted = pa.array(sorted({line.name for line in lines}), pa.string())
    found = np.flatnonzero(pc.is_in(rows.names, value_set=wanted).to_numpy(zero_copy_only=False))
    names = rows.names.take(pa.array(found)).to_pylist()
    return {(ids[int(rows.labels[i])], name): int(i) for i, name in zip(found, names, strict=True)}


def apply_lines(
    split: str, rows: SplitRows, ids: list[str], curation: Curation, manifests: Path
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(labels, keep) of every row of `split` with its lines applied, and the lines whose image convert
    quarantined (in the manifest, not in the shards: nothing to apply). A line naming no image fails."""
    exclude = [line for line in curation.exclude if line.split == split]
    relabel = [line for line in curation.relabel if line.split == split]
    index = _class_index(ids, exclude + relabel)
    position = _positions(rows, ids, exclude + relabel)
    missing = [line for line in exclude + relabel if (line.wnid, line.name) not in position]
    quarantined = _quarantined(manifests, split, missing)
    labels, keep = rows.labels.copy(), np.ones(len(rows.labels), dtype=bool)
    for line in relabel:
        if (line.wnid, line.name) in position:
            labels[position[line.wnid, line.name]] = index[str(line.new_wnid)]
    for line in exclude:
        if (line.wnid, line.name) in position:
            keep[position[line.wnid, line.name]] = False
    return labels, keep, quarantined


def _class_index(ids: list[str], lines: list[Line]) -> dict[str, int]:
    """Class name -> label; a line naming a class the dataset does not have fails. Names are compared exactly:
    "cat " is a class of its own (ImageFolder keeps it apart from "cat"), never "cat"."""
    index = {name: label for label, name in enumerate(ids)}
    for line in lines:
        for key, name in (("wnid", line.wnid), ("new_wnid", line.new_wnid)):
            if name is not None and name not in index:
                kept = "a class of the dataset (label_map.json: the classes extract keeps; a relabel never drops)"
                curation_lines.fail(line.where, f"{key} {kept}", repr(name))
    return index


def _quarantined(manifests: Path, split: str, missing: list[Line]) -> list[dict[str, Any]]:
    """The `missing` lines whose image the manifest lists (convert quarantined it); any other fails."""
    if not missing:
        return []
    path = manifest_path(manifests, split)
    table = pq.read_table(path, columns=["wnid", "name"])
    listed = table.filter(pc.is_in(table.column("name"), value_set=pa.array(sorted({x.name for x in missing}))))
    known = set(zip(listed.column("wnid").to_pylist(), listed.column("name").to_pylist(), strict=True))
    for line in missing:
        if (line.wnid, line.name) not in known:
            curation_lines.fail(
                line.where, f"an image {line.name} of class {line.wnid} in {split}", "no such image in the source"
            )
    return [{"where": x.at, "split": split, "wnid": x.wnid, "name": x.name} for x in missing]


def write_overlays(job: CurateJob) -> dict[str, Any]:
    """Every split's overlay and curation.json, published as one directory (a kill -9 mid-write leaves the previous
    overlay whole, or none); returns the report (curation.json's content)."""
    ids = class_ids(read_label_map(job.label_map))
    held = "holdout" in _extract_report(job.manifests)
    found: dict[str, dict[str, set[str]]] = {"before": {}, "after": {}}
    overlays, quarantined = {}, []
    for split in SPLITS:
        rows = read_split(job.parquet, split)
        labels, keep, missing = apply_lines(split, rows, ids, job.curation, job.manifests)
        found["before"][split] = {ids[i] for i in np.unique(rows.labels)}
        found["after"][split] = {ids[i] for i in np.unique(labels[keep])}
        edits = {"relabelled": int((labels != rows.labels).sum()), "excluded": int((~keep).sum())}
        overlays[split] = overlay_table(split, rows.shards, labels, keep, edits)
        quarantined += missing
    curation_lines.check_classes(job.curation, found, ids, held)
    report = _report(job.curation, quarantined)
    with atomic_path(job.overlay, path_key("overlay")) as tmp:  # published whole: a kill never mixes two versions
        tmp.mkdir()
        for split, table in overlays.items():
            write_overlay(table, tmp / f"{split}.parquet")
        write_json(tmp / CURATION_REPORT, report)
    return report


def _report(curation: Curation, quarantined: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {
        split: {
            kind: curation_lines.line_counts([x for x in lines if x.split == split], kind == "relabel")
            for kind, lines in (("exclude", curation.exclude), ("relabel", curation.relabel))
        }
        for split in SPLITS
    }
    return {**curation_lines.curation_report(curation, counts), "not_in_shards": quarantined}


def _extract_report(manifests: Path) -> dict[str, Any]:
    path = manifests / EXTRACT_REPORT
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return found

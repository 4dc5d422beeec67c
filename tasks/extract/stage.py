"""Extract stage: index the archives (or an ImageFolder tree) into per-split manifests and one label map.

Nothing is copied: a manifest row says where an image's bytes lie (`source`, `offset`, `size`), so reading it
is one `pread` from the verified archive. `job_from_params` turns params.yaml into an `ExtractJob`; then (each a
Prefect task in flows/extract.py) `scan_split` writes a staging index per split under `<work>/extract/` (archive
or folder), `finalize_job` labels val, applies the class subset, checks train/val agree and writes the outputs of
docs/CONTRACTS.md; `tasks.extract.materialize` optionally writes an ImageFolder tree."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.common import ARCHIVES, SPLITS, PipelineError, atomic_path, write_json
from tasks.common.archive21k import LAYOUT_KEY, layout
from tasks.common.archive_pass import entries_table, load_prescan
from tasks.common.class_lists import read_class_list
from tasks.common.layout import EXTRACT_REPORT, PRESCAN
from tasks.common.manifests import MANIFEST_SCHEMA, dictionary_columns, read_columns
from tasks.common.params import HoldoutParams, Project
from tasks.common.synsets import Catalog, shipped_catalog
from tasks.common.tarindex import index_archive
from tasks.extract import classes as labels
from tasks.extract.devkit import label_val
from tasks.extract.folder_scan import scan_folder_split, source_path
from tasks.extract.holdout import HOLDOUT_WHERE, split_holdout
from tasks.extract.write import write_manifests

log = logging.getLogger(__name__)
STAGING_SCHEMA = pa.schema([f for f in MANIFEST_SCHEMA if f.name not in ("split", "label")])


@dataclass(frozen=True)
class ExtractJob:
    """The stage's job, from params.yaml `extract:` and `paths:` (every path absolute)."""

    mode: str  # archives | folder | archive21k
    inputs: dict[str, Path]  # split -> the archive (archives mode; archive21k: its one tar) or the tree's root (folder)
    devkit: Path
    staging: Path
    manifests: Path
    label_map: Path
    tree: Path | None  # the ImageFolder tree to write (materialize, archives mode only)
    classes: str  # as given: all | imagenet100 | a file (recorded in extract_report.json)
    val_labels: str  # as given: devkit | a CSV
    root: Path  # the project: manifest `source` paths are relative to it, and so are the files above
    prescan: Path | None = None  # the tar indexes made while the archives were hashed (tasks.common.archive_pass)
    md5s: dict[str, str] = field(default_factory=dict)  # split -> its archive's MD5 as verify accepted it
    catalog: str = "auto"  # as given: auto | derived | a wnid<TAB>words table
    holdout: HoldoutParams | None = None  # val held out of train (a source without a val split)

    @property
    def archives(self) -> bool:
        """The input is indexed tars (ILSVRC2012's archives, or archive21k's one tar of per-class tars)."""
        return self.mode in ("archives", "archive21k")


def job_from_params(project: Project) -> ExtractJob:
    """The job; an unreadable class list or catalog fails now, before hours of scanning."""
    params, raw, work = project.params.extract, project.path("raw"), project.path("work")
    archives = params.mode == "archives"  # ILSVRC2012's three (archive21k: tasks.acquire.archive21k's one)
    if params.materialize and not archives:
        log.warning("extract.materialize ignored in %s mode (written for ILSVRC2012's archives only)", params.mode)
    # checked before any scan: ILSVRC2012's classes (archives), a supplied table, or none yet (a folder tree)
    known = shipped_catalog() if archives else labels.catalog_of(params.catalog, project.root)
    read_class_list(params.classes, project.root, known)
    return ExtractJob(
        params.mode,
        _inputs(project),
        raw / ARCHIVES["devkit"],
        work / "extract",
        project.path("manifests"),
        project.path("label_map"),
        work / "imagefolder" if params.materialize and archives else None,
        params.classes,
        params.val_labels,
        project.root,
        work / PRESCAN,
        _verified_md5s(raw) if params.mode != "folder" else {},
        params.catalog,
        params.holdout,
    )


def _verified_md5s(raw: Path) -> dict[str, str]:
    """split -> the MD5 verify.json records for its archive ({} without a verify.json: nothing is reused)."""
    try:
        verified = json.loads((raw / "verify.json").read_text(encoding="utf-8"))
        archives, one = verified["archives"], verified.get(LAYOUT_KEY)
    except (OSError, ValueError, KeyError, AttributeError):
        return {}
    names = {"train": one["tar"]} if isinstance(one, dict) and "tar" in one else ARCHIVES
    return {split: archives[name]["md5"] for split, name in names.items() if name in archives}


def _inputs(project: Project) -> dict[str, Path]:
    """split -> its archive (archives mode), or the root of the train/<wnid>, val/<wnid> tree (folder mode)."""
    params, raw = project.params.extract, project.path("raw")
    if params.mode == "archives":
        return {split: raw / ARCHIVES[split] for split in SPLITS}
    if params.mode == "archive21k":  # one tar: train is all of it, val held out of it (extract.holdout)
        return dict.fromkeys(SPLITS, raw / layout(project.params.download)["tar"])
    assert params.folder is not None  # ExtractParams refuses folder mode without a folder
    return dict.fromkeys(SPLITS, project.resolve(params.folder))


def scan_split(job: ExtractJob, split: str) -> Path:
    """Index one split's input into the staging directory; return the staging index path (with a holdout, val's
    is empty: finalize holds val out of train)."""
    if job.holdout is not None and split != "train":
        return _empty_holdout_split(job, split)
    if job.archives:
        archive = job.inputs[split]
        found = load_prescan(job.prescan, split, archive, job.md5s.get(split)) if job.prescan else None
        return scan_archive_split(split, archive, job.staging, job.root, found)
    return scan_folder_split_to(split, job.inputs[split], job.staging, job.root)


def finalize_job(job: ExtractJob) -> dict[str, Any]:
    """`finalize` with the job's paths and params."""
    return finalize(
        job.staging,
        job.manifests,
        job.label_map,
        mode=job.mode,
        val_labels=job.val_labels,
        classes=job.classes,
        devkit_path=job.devkit,
        imagefolder=source_path(job.tree, job.root) if job.tree else None,
        root=job.root,
        catalog=job.catalog,
        holdout=job.holdout,
    )


def write_staging(staging_dir: Path, split: str, table: pa.Table, where: str, reported: list[dict[str, str]]) -> Path:
    """One split's staged index (STAGING_SCHEMA rows) and where it came from, as `finalize` reads them (the
    benchmarks stage synthetic indexes through it too)."""
    with atomic_path(staging_dir / f"{split}.parquet") as tmp:
        pq.write_table(table, tmp)
    write_json(staging_dir / f"{split}.scan.json", {"where": where, "reported": reported})
    return staging_dir / f"{split}.parquet"


def scan_archive_split(
    split: str,
    archive: str | os.PathLike[str],
    staging_dir: str | os.PathLike[str],
    root: str | os.PathLike[str] = ".",
    prescan: tuple[pa.Table, list[dict[str, str]]] | None = None,
) -> Path:
    """Index the train archive (nested per-class tars) or the val archive — or take `prescan`, the index made in
    the same read as its MD5 (tasks.common.archive_pass.load_prescan) — and return the staging index path."""
    source = source_path(archive, root)
    if prescan is None:
        entries, reported = index_archive(archive, split, source)
        found = entries_table(entries)
    else:
        found, reported = prescan
        reported = [{**item, "source": source} for item in reported]  # the pass did not know the project's name
    table = found.append_column("source", pa.array([source] * found.num_rows, pa.string())).select(STAGING_SCHEMA.names)
    how = "(the index made while verifying its MD5)" if prescan else ""
    log.info("%s: indexed %d images of %s %s", split, table.num_rows, archive, how)
    return write_staging(Path(staging_dir), split, table, str(archive), reported)


def scan_folder_split_to(
    split: str, folder: str | os.PathLike[str], staging_dir: str | os.PathLike[str], root: str | os.PathLike[str] = "."
) -> Path:
    """Index `<folder>/<split>/<wnid>/*` (folder mode); return the staging index path."""
    table, reported = scan_folder_split(folder, split, root, STAGING_SCHEMA)
    return write_staging(Path(staging_dir), split, table, str(Path(folder) / split), reported)


def _empty_holdout_split(job: ExtractJob, split: str) -> Path:
    shipped = job.inputs[split] / split
    if not job.archives and shipped.exists():
        raise PipelineError(
            f"{shipped}: expected no {split} folder with extract.holdout set (the holdout makes {split} out of "
            f"train), found one; set extract.holdout: null to use it, or move it away"
        )
    return write_staging(job.staging, split, STAGING_SCHEMA.empty_table(), HOLDOUT_WHERE, [])


def _read_staging(staging_dir: Path, split: str) -> tuple[pa.Table, dict[str, Any]]:
    scan = json.loads((staging_dir / f"{split}.scan.json").read_text(encoding="utf-8"))
    path = staging_dir / f"{split}.parquet"  # read once (13 M rows), a class, a tar, an archive as dictionaries
    return read_columns(path, STAGING_SCHEMA.names, dictionary_columns(path)), scan


def finalize(
    staging_dir: str | os.PathLike[str],
    manifests_dir: str | os.PathLike[str],
    label_map_path: str | os.PathLike[str],
    mode: str = "archives",
    val_labels: str = "devkit",
    classes: str = "all",
    devkit_path: str | os.PathLike[str] | None = None,
    imagefolder: str | None = None,
    root: str | os.PathLike[str] = ".",
    catalog: str = "auto",
    holdout: HoldoutParams | None = None,
) -> dict[str, Any]:
    """Label val (or hold it out of train), select classes, check train/val agree; write manifests,
    extract_report.json, label map.

    `classes`, `val_labels` and `catalog` name files relative to `root` (the project) when they are paths."""
    staging = {split: _read_staging(Path(staging_dir), split) for split in SPLITS}
    tables = {split: table for split, (table, _) in staging.items()}
    where = {split: scan["where"] for split, (_, scan) in staging.items()}
    reported = [item for split in SPLITS for item in staging[split][1]["reported"]]
    del staging  # the tables are replaced as they are labelled: no second copy of 13 M rows held
    _log_reported(reported)
    held = None
    if holdout is not None:
        tables["train"], tables["val"], held = split_holdout(tables["train"], holdout, by_class=mode == "folder")
    tables, known, label_source = _label(tables, where, mode, val_labels, devkit_path, Path(root), catalog)
    subset = read_class_list(classes, Path(root))
    found = {split: set(table.column("wnid").unique().to_pylist()) for split, table in tables.items()}
    keep = _select(found, where, known, subset, held is not None)
    label_map = labels.label_map(keep, known, label_source)
    counts = write_manifests(
        Path(manifests_dir), tables, {c["wnid"] or c["name"]: c["label"] for c in label_map["classes"]}
    )
    report = {
        "mode": mode,
        "label_source": label_source,
        "catalog": known.name if known else None,
        "classes": str(classes),
        "num_classes": len(keep),
        "images": {s: n for s, (n, _) in counts.items()},
        "outside_subset": {s: n for s, (_, n) in counts.items()},
        "reported": reported,
        "imagefolder": imagefolder,
        **({"holdout": held} if held else {}),
    }
    write_json(Path(manifests_dir) / EXTRACT_REPORT, report)
    write_json(label_map_path, label_map)
    return report


def _label(
    tables: dict[str, pa.Table],
    where: dict[str, str],
    mode: str,
    val_labels: str,
    devkit_path: str | os.PathLike[str] | None,
    root: Path,
    catalog: str,
) -> tuple[dict[str, pa.Table], Catalog | None, str]:
    """(tables, the catalog — None for a tree not named by wnids —, label source): archives mode labels val."""
    if mode == "folder":
        found = {name for table in tables.values() for name in table.column("wnid").unique().to_pylist()}
        return tables, labels.folder_catalog(found, catalog, root), "folder"
    if mode == "archive21k":  # classes = the per-class tars' wnids; their words from extract.catalog
        return tables, labels.catalog_of(catalog, root), "archive21k"
    val, known, label_source = label_val(
        tables["val"], where["val"], str(val_labels), Path(devkit_path) if devkit_path else None, root
    )
    return {**tables, "val": val}, known, label_source


def _select(
    found: dict[str, set[str]], where: dict[str, str], catalog: Catalog | None, subset: list[str] | None, held: bool
) -> list[str]:
    """The classes to keep: every wnid found must be in the catalog (a WordNet-named source); train and val agree
    (or hold the subset; `held`: val held out of train may lack a class)."""
    for split in SPLITS:
        if catalog is not None:
            labels.check_known(found[split], catalog, where[split])
    return labels.select_classes(found["train"], found["val"], subset, where["train"], where["val"], held)


def _log_reported(reported: list[dict[str, str]], limit: int = 20) -> None:
    for item in reported[:limit]:
        log.warning("%s: %s %s: %s (%s)", item["split"], item["source"], item["member"], item["reason"], item["action"])
    if len(reported) > limit:
        log.warning(
            "… %d more reported files: see extract_report.json (or the staging *.scan.json)", len(reported) - limit
        )

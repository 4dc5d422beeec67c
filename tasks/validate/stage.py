"""Validate stage: schema and label checks over the Parquet shards, with reports a reviewer reads.

`run_validation` reads the inputs (docs/CONTRACTS.md), runs every check and returns the report dict;
`write_reports` (tasks.validate.report) and `write_contact_sheet` (tasks.validate.contact_sheet) write the outputs;
`raise_if_failed` ends the stage with a short summary when a check failed — after the reports are written.
The curation overlay (tasks.validate.merged) gives the merged view the class-level checks see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from imagenet_parquet.format import COLUMNS, class_ids, read_label_map
from imagenet_parquet.overlay import LABEL_MAP_FORMAT, OVERLAY_DIR
from tasks.common import SPLITS, PipelineError
from tasks.common.layout import BAD_IMAGES, EXTRACT_REPORT
from tasks.common.manifests import manifest_path
from tasks.common.params import ValidateParams
from tasks.validate.changes import shard_digests, version_index
from tasks.validate.checks import DESCRIPTIONS, CheckResult, row_failures, shard_schema_check
from tasks.validate.converted import CONVERTED_FILE, MANIFESTS_FILE, KeptChecks, manifest_inputs
from tasks.validate.dataset_checks import (
    class_count_check,
    class_set_check,
    class_table,
    count_summary,
    leakage_check,
    manifest_check,
    manifest_label_check,
)
from tasks.validate.kept_metadata import METADATA_DIR, KeptMetadata
from tasks.validate.merged import View, apply_overlays, merged_frame, overlay_formats, require_overlays
from tasks.validate.near_dup import NEAR_DIR, PairCache, near_duplicate_check
from tasks.validate.report import build_report, failure_summary, plain
from tasks.validate.scan import (
    SCAN_DIR,
    ByteFindings,
    ScanCache,
    Shard,
    decode_mask,
    list_shards,
    read_metadata,
    scan_bytes,
)
from tasks.validate.sources import (
    Sources,
    appended_splits,
    appended_totals,
    pandera_by_map,
    row_class_ids,
    shard_sources,
    source_masks,
    to_current,
)

BAD_IMAGE_FIELDS = ["split", "source", "member", "name", "reason"]


def load_manifests(manifests_dir: str | Path) -> dict[str, pd.DataFrame]:
    """(split, name, label, wnid) of each manifest — the images the extract stage listed."""
    manifests = {}
    for split in SPLITS:
        path = manifest_path(manifests_dir, split)
        if not path.is_file():
            raise PipelineError(
                f"{path}: expected the {split} manifest written by the extract stage, found no "
                "file; run `dvc repro extract`"
            )
        frame = pq.read_table(path, columns=["name", "label", "wnid"]).to_pandas()
        manifests[split] = frame.assign(split=split)
    return manifests


def load_bad_images(path: str | Path) -> pd.DataFrame:
    """The images the convert stage quarantined (bad_images.jsonl), one row each."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(
            f"{path}: expected the convert stage's list of quarantined images (possibly empty), "
            "found no file; run `dvc repro convert`"
        )
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        rows = [json.loads(line) for line in lines]
    except json.JSONDecodeError as err:
        raise PipelineError(
            f"{path}: expected one JSON object per line, found {err}; re-run the convert stage"
        ) from None
    return pd.DataFrame(rows, columns=BAD_IMAGE_FIELDS).astype({"reason": str})


def run_validation(
    parquet_dir: str | Path,
    manifests_dir: str | Path,
    label_map_path: str | Path,
    params: ValidateParams,
    overlay_dir: str | Path | None = None,
    work_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Every check over the dataset; returns the report dict (see tasks.validate.report.build_report).

    The shards are checked as converted against the manifests (all rows, labels as stored); the classes, counts,
    leakage, near-duplicates and the decode sample are of the merged view: the curation overlay in `overlay_dir`
    (None: `<parquet_dir>/../overlay`, where readers find it) applied — labels now, excluded rows dropped.
    `work_dir` (`<paths.work>/validate`): scratch space where each shard's byte findings are kept (`scan/`) and
    reused while the shard and what its rows are checked against are unchanged (tasks.validate.scan); each
    unchanged shard's metadata columns (`metadata/`, tasks.validate.kept_metadata); the checks of the shards as
    converted and against the manifests while neither changed (`converted.json`, `manifests.json`:
    tasks.validate.converted). The report is the same either way. None: every shard read, every check run."""
    overlays = Path(overlay_dir) if overlay_dir is not None else Path(parquet_dir).parent / OVERLAY_DIR
    curation = require_overlays(overlays)  # before any shard is read
    label_map = read_label_map(label_map_path)
    listed, limit = list_shards(parquet_dir), params.report_examples
    format2 = LABEL_MAP_FORMAT in overlay_formats(overlays).values()
    inputs = manifest_inputs(Path(manifests_dir), Path(parquet_dir) / BAD_IMAGES)
    kept = KeptChecks(work_dir, listed, label_map, format2, limit, inputs)  # keyed before shards, manifests are read
    manifests = load_manifests(manifests_dir)
    bad = load_bad_images(Path(parquet_dir) / BAD_IMAGES)
    tables = KeptMetadata(Path(work_dir) / METADATA_DIR if work_dir is not None else None)
    meta, plan = read_metadata(listed, tables)
    tables.prune(listed)
    sources = shard_sources(plan, label_map, format2)
    results, shards = _as_converted(meta, plan, sources, label_map, limit, kept)
    masks = _classes_as_found(meta, plan, sources, label_map, manifests)
    live = None if masks is None else masks["live"]
    meta = meta.reindex(columns=list(dict.fromkeys([*meta.columns, "image_path", *COLUMNS[1:]])))
    view = apply_overlays(meta, plan, overlays, label_map, limit, live, appended_splits(plan, sources, label_map))
    merged = merged_frame(meta, view, label_map)
    checked = meta if live is None else meta[live]  # the rows the source holds now, against the manifests
    against, totals = _against_manifests(checked, manifests, bad, limit, kept)
    results += [view.result, *against]
    classes, counts, class_results = _class_checks(merged, label_map, params, Path(manifests_dir))
    cache = ScanCache(Path(work_dir) / SCAN_DIR) if work_dir is not None else None
    findings = scan_bytes(plan, meta, _decode_rows(meta, merged, params.decode_sample), params.workers, cache=cache)
    results += class_results + _byte_checks(meta, findings, len(plan), limit)
    results.append(leakage_check(merged, params.leakage_max_pairs, limit))
    views = {s: view.split(meta, s) for s in SPLITS}
    converted = None if live is None else {s: meta.loc[meta["split"] == s, "label"].to_numpy() for s in SPLITS}
    pair_cache = PairCache(Path(work_dir) / NEAR_DIR if work_dir is not None else None)
    near, near_section = near_duplicate_check(parquet_dir, params, class_ids(label_map), views, converted, pair_cache)
    pair_cache.prune()
    results.append(near)
    splits = {s: _split_totals(s, totals[s], plan, classes, findings, view) for s in SPLITS}
    for split in SPLITS if masks is not None else ():
        splits[split].update(appended_totals(meta, split, masks or {}, view.keep))
    report = build_report(_ordered(results), splits, classes, counts, bad, label_map, params)
    report["curation"] = {k: v for k, v in curation.items() if k != "applied"}
    report["version"] = version_index(meta, merged, label_map, curation, shards=shards)  # recorded, then dropped
    return {**report, "near_duplicates": plain(near_section)}


def _as_converted(
    meta: pd.DataFrame, plan: list[Shard], sources: Sources, label_map: dict[str, Any], limit: int, kept: KeptChecks
) -> tuple[list[CheckResult], dict[str, Any]]:
    """The checks of the shards as converted and the version index's shard digests (labels as stored: before
    `_classes_as_found`): kept from a run over the same shards (tasks/validate/converted.py), else found and kept."""
    found = kept.load(CONVERTED_FILE)
    if found is not None:
        return found
    results = _shard_checks(meta, plan, sources, label_map, limit)
    stored = meta.reindex(columns=["split", "shard", "image_path", "label", "sha256"])
    digests = shard_digests(stored, label_map, sources.map_digests(plan) if sources.mixed else None)
    kept.store(CONVERTED_FILE, results, digests)
    return results, digests


def _against_manifests(
    checked: pd.DataFrame, manifests: dict[str, pd.DataFrame], bad: pd.DataFrame, limit: int, kept: KeptChecks
) -> tuple[list[CheckResult], dict[str, Any]]:
    """The shard rows the source holds against the manifests (totals, labels) and the split totals: kept from a
    run over the same shards and manifests, else found and kept."""
    found = kept.load(MANIFESTS_FILE)
    if found is not None:
        return found
    totals_result, totals = manifest_check(checked, manifests, bad, limit)
    results = [totals_result, manifest_label_check(checked, manifests, limit)]
    kept.store(MANIFESTS_FILE, results, totals)
    return results, totals


def _shard_checks(
    meta: pd.DataFrame, plan: list[Shard], sources: Sources, label_map: dict[str, Any], limit: int
) -> list[CheckResult]:
    """The schema, metadata and pandera checks of the shards as converted: against label_map.json, or each shard
    against its own label map when they differ (appended shards, a format-2 overlay: tasks/validate/sources.py)."""
    files = [(s.split, s.path, s.footer.schema.to_arrow_schema()) for s in plan]
    own = [c.label_map for c in sources.shards] if sources.mixed else None
    return shard_schema_check(files, label_map, limit, own) + pandera_by_map(meta, plan, sources, label_map, limit)


def _classes_as_found(
    meta: pd.DataFrame, plan: list[Shard], sources: Sources, label_map: dict[str, Any], manifests: dict[str, Any]
) -> dict[str, np.ndarray] | None:
    """Sets `wnid` (the class as found: its label's class id — the folder name of a dataset not named by wnids,
    whose shards carry a null wnid —, the key the manifests, the counts and the versions index use). With appended
    shards or other label maps (`sources.mixed`), from each shard's own label map; `label` then becomes the label as
    converted in label_map.json's numbering (-1: a class it no longer has; `label_stored`: as stored) and, per row,
    what the source did is returned (sources.source_masks; else None)."""
    if not sources.mixed:
        meta["wnid"] = meta["label"].map(dict(enumerate(class_ids(label_map))))
        return None
    ids = row_class_ids(meta, plan, sources)
    meta["wnid"] = ids
    meta["label_stored"] = meta["label"]
    meta["label"] = to_current(ids, label_map)
    return source_masks(meta, ids, plan, sources, manifests)


def _class_checks(
    merged: pd.DataFrame, label_map: dict[str, Any], params: ValidateParams, manifests_dir: Path
) -> tuple[pd.DataFrame, dict[str, Any], list[CheckResult]]:
    """The class table, the count summary and the class set / count checks, of the merged view."""
    classes = class_table(merged, label_map)
    counts = count_summary(classes, {"train": params.train_count, "val": params.val_count})
    holdout = _extract_report(manifests_dir).get("holdout")  # val held out of train: a class may get no val image
    limit = params.report_examples
    return classes, counts, [class_set_check(classes, limit, holdout), class_count_check(classes, counts, limit)]


def _decode_rows(meta: pd.DataFrame, merged: pd.DataFrame, sample: int | float | str) -> np.ndarray:
    """The decode sample (a mask over `meta`'s rows) drawn from the rows the merged view keeps."""
    mask = np.zeros(len(meta), dtype=bool)
    mask[merged.index.to_numpy()] = decode_mask(merged, sample)
    return mask


def _byte_checks(meta: pd.DataFrame, findings: ByteFindings, shards: int, limit: int) -> list[CheckResult]:
    """The checks of the stored bytes, over every shard row."""
    return [
        row_failures("jpeg_soi", meta, findings.not_jpeg, limit, "stored images are JPEG"),
        row_failures("sha256_match", meta, findings.hash_mismatch, limit, "hashes match"),
        _index_check(meta, findings, shards, limit),
        row_failures(
            "decode", meta, findings.undecodable, limit, f"{sum(findings.decoded.values())} sampled rows decode"
        ),
    ]


def _split_totals(
    split: str, totals: dict[str, int], plan: list[Shard], classes: pd.DataFrame, findings: ByteFindings, view: View
) -> dict[str, int]:
    """A split's counts: shard rows (manifest check), what the overlay changes, classes of the merged view."""
    edits = view.edits.get(split, {"relabelled": 0, "excluded": 0})
    return {
        **totals,
        "excluded": edits["excluded"],
        "relabelled": edits["relabelled"],
        "images": totals["rows"] - edits["excluded"],
        "shards": sum(p.split == split for p in plan),
        "classes": int((classes[split] > 0).sum()),
        "image_bytes": findings.image_bytes.get(split, 0),
        "decoded": findings.decoded.get(split, 0),
    }


def _extract_report(manifests_dir: Path) -> dict[str, Any]:
    path = manifests_dir / EXTRACT_REPORT
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return found


def _index_check(meta: pd.DataFrame, findings: ByteFindings, shards: int, limit: int) -> CheckResult:
    """Shards from elsewhere may carry no byte index (readers then read row groups): named, not failed."""
    result = row_failures("image_index", meta, findings.index_mismatch, limit, "byte-index entries")
    missing = findings.unindexed
    if missing:
        result.message += (
            f"; {len(missing)} of {shards} shard(s) carry no index (readers use row-group reads): "
            f"{', '.join(missing[:3])}"
        )
    return result


def _ordered(results: list[CheckResult]) -> list[CheckResult]:
    order = list(DESCRIPTIONS)
    return sorted(results, key=lambda r: order.index(r.name))


def raise_if_failed(report: dict[str, Any], reports_dir: str | Path) -> None:
    """End the stage non-zero (PipelineError) when a check failed; warnings pass."""
    if report["status"] == "fail":
        raise PipelineError(failure_summary(report, Path(reports_dir)))

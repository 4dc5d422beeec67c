"""Validate stage: schema and label checks over the Parquet shards, with reports a reviewer reads.

`run_validation` reads the inputs (docs/CONTRACTS.md), runs every check and returns the report dict;
`write_reports` (tasks.validate.report) and `write_contact_sheet` (tasks.validate.contact_sheet) write the outputs;
`raise_if_failed` ends the stage with a short summary when a check failed — after the reports are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from imagenet_parquet.format import COLUMNS, class_ids, read_label_map
from tasks.common import SPLITS, PipelineError
from tasks.common.layout import BAD_IMAGES, EXTRACT_REPORT
from tasks.common.manifests import manifest_path
from tasks.common.params import ValidateParams
from tasks.validate.changes import version_index
from tasks.validate.checks import DESCRIPTIONS, CheckResult, pandera_checks, row_failures, shard_schema_check
from tasks.validate.dataset_checks import (
    class_count_check,
    class_set_check,
    class_table,
    count_summary,
    leakage_check,
    manifest_check,
    manifest_label_check,
)
from tasks.validate.near_dup import near_duplicate_check
from tasks.validate.report import build_report, failure_summary, plain
from tasks.validate.scan import ByteFindings, decode_mask, list_shards, read_metadata, scan_bytes

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
    parquet_dir: str | Path, manifests_dir: str | Path, label_map_path: str | Path, params: ValidateParams
) -> dict[str, Any]:
    """Every check over the dataset; returns the report dict (see tasks.validate.report.build_report)."""
    label_map = read_label_map(label_map_path)
    manifests = load_manifests(manifests_dir)
    bad = load_bad_images(Path(parquet_dir) / BAD_IMAGES)
    meta, plan = read_metadata(list_shards(parquet_dir))
    limit = params.report_examples
    results = shard_schema_check([(s.split, s.path, s.footer.schema.to_arrow_schema()) for s in plan], label_map, limit)
    results += pandera_checks(meta, label_map, limit)
    # From here on `wnid` is the class as found (its label's class id: the folder name of a dataset not named by
    # wnids, whose shards carry a null wnid), the key the manifests, the counts and the versions index use.
    meta["wnid"] = meta["label"].map(dict(enumerate(class_ids(label_map))))
    meta = meta.reindex(columns=list(dict.fromkeys([*meta.columns, "image_path", *COLUMNS[1:]])))
    classes = class_table(meta, label_map)
    counts = count_summary(classes, {"train": params.train_count, "val": params.val_count})
    extract_report = _extract_report(Path(manifests_dir))
    holdout = extract_report.get("holdout")  # val held out of train: a class may get no val image
    results += [class_set_check(classes, limit, holdout), class_count_check(classes, counts, limit)]
    manifest_result, totals = manifest_check(meta, manifests, bad, limit)
    results += [manifest_result, manifest_label_check(meta, manifests, limit)]
    findings = scan_bytes(plan, meta, decode_mask(meta, params.decode_sample), params.workers)
    results += [
        row_failures("jpeg_soi", meta, findings.not_jpeg, limit, "stored images are JPEG"),
        row_failures("sha256_match", meta, findings.hash_mismatch, limit, "hashes match"),
        _index_check(meta, findings, len(plan), limit),
        row_failures(
            "decode", meta, findings.undecodable, limit, f"{sum(findings.decoded.values())} sampled rows decode"
        ),
        leakage_check(meta, params.leakage_max_pairs, limit),
    ]
    near, near_section = near_duplicate_check(parquet_dir, params, class_ids(label_map))
    results.append(near)
    splits = {
        s: {
            **totals[s],
            "shards": sum(p.split == s for p in plan),
            "classes": int((classes[s] > 0).sum()),
            "image_bytes": findings.image_bytes.get(s, 0),
            "decoded": findings.decoded.get(s, 0),
        }
        for s in SPLITS
    }
    report = build_report(_ordered(results), splits, classes, counts, bad, label_map, params)
    report["curation"] = {k: v for k, v in extract_report.get("curation", {}).items() if k != "applied"}
    report["version"] = version_index(meta, label_map, extract_report)  # flows/validate records it, then drops it
    return {**report, "near_duplicates": plain(near_section)}


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

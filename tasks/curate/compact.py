"""Compaction: the curation overlay folded into shards (`python -m tasks.curate.compact`, `make compact`), for
whoever wants shards that any Parquet tool reads with the current labels (pandas, Hugging Face `datasets`, Spark).

Per split, the shards of `paths.parquet` and their overlay (`paths.overlay`, checked against them: a stale one is
refused) become `<out>/<split>/` (default `data/compacted`, git-ignored; inside the project): the same shard names
and row order, the excluded rows dropped (a shard left empty is dropped), `label`/`wnid`/`label_name` the
overlay's, metadata `curation: applied` (readers apply no overlay to them) and the footer byte index written anew.
The rows go through the convert stage's writer (tasks/convert/writer.py: the same settings, deterministic bytes; a
tool of the curate package, not a DVC stage, so it reuses convert's writer rather than a second one). Each split
directory is replaced whole (atomic); `<out>/compaction.json` records the overlay each split was compacted from."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import (
    FORMAT_VERSION,
    FormatError,
    class_names,
    label_map_from_metadata,
    own_metadata,
    shard_schema,
)
from imagenet_parquet.overlay import CURATION_APPLIED, Overlay, load_overlay
from tasks.common import SPLITS, PipelineError, atomic_path, write_json
from tasks.common.params import Project, load_project
from tasks.convert.writer import write_shard
from tasks.curate.stage import read_split

DEFAULT_OUT = "data/compacted"
REPORT = "compaction.json"
TODO = "run `dvc repro curate` (or `dvc pull` the shards and data/overlay of one version together), then compact again"


@dataclass(frozen=True)
class CompactJob:
    parquet: Path
    overlay: Path
    out: Path


@dataclass
class SplitPlan:
    """One split ready to write: its shards [(file, rows)], the overlay checked against them, the shard schema."""

    split: str
    files: list[tuple[Path, int]]
    overlay: Overlay
    schema: pa.Schema
    columns: list[tuple[str | None, str]]  # (wnid, label_name) by label, as convert writes them
    row_group_rows: int


def job_from_params(project: Project, out: str | Path = DEFAULT_OUT) -> CompactJob:
    """The job; `out` (relative: to the project) must lie inside the project, apart from what is read."""
    parquet, overlay = project.path("parquet"), project.path("overlay")
    target = project.resolve(out).resolve()
    root = project.root.resolve()
    if target == root or not target.is_relative_to(root):
        raise PipelineError(
            f"compact --out: expected a directory inside the project {root} (e.g. {DEFAULT_OUT}, git-ignored), "
            f"found {target}; pass a path under the project"
        )
    for key, path in (("paths.parquet", parquet), ("paths.overlay", overlay)):
        inside = path.resolve()
        if target.is_relative_to(inside) or inside.is_relative_to(target):
            raise PipelineError(
                f"compact --out: expected a directory apart from {inside} (params.yaml {key}, read by compaction), "
                f"found {target}; pass another directory, e.g. {DEFAULT_OUT}"
            )
    return CompactJob(parquet, overlay, target)


def compact(job: CompactJob) -> dict[str, Any]:
    """Every split compacted into `job.out`; returns (and writes as compaction.json) what was done."""
    plans = [plan_split(job, split) for split in SPLITS]  # every overlay checked before anything is written
    report = {"source": str(job.parquet), "splits": {plan.split: write_split(job.out, plan) for plan in plans}}
    write_json(job.out / REPORT, report)
    return report


def plan_split(job: CompactJob, split: str) -> SplitPlan:
    shards = read_split(job.parquet, split).shards
    files = [(job.parquet / split / name, rows) for name, rows, _ in shards]
    meta = pq.read_metadata(files[0][0]).metadata
    schema, label_map = _schema(files[0][0], meta, split)
    path = job.overlay / f"{split}.parquet"
    if not path.is_file():
        raise PipelineError(
            f"{path}: expected the curation overlay of the {split} shards in {job.parquet / split}, found no file; "
            f"{TODO}"
        )
    try:
        names, rows, footers = [s[0] for s in shards], [s[1] for s in shards], [s[2] for s in shards]
        overlay = load_overlay(path, names, rows, footers, len(label_map["classes"]))
    except FormatError as err:  # OverlayError: made for other shards, altered, damaged — it names the file
        raise PipelineError(f"{err} (compaction needs the overlay made for exactly these shards)") from None
    params = (own_metadata(meta) or {}).get("convert_params") or {}
    row_group_rows = int(params.get("row_group_rows") or pq.read_metadata(files[0][0]).row_group(0).num_rows)
    columns = [(c.get("wnid"), n) for c, n in zip(label_map["classes"], class_names(label_map), strict=True)]
    return SplitPlan(split, files, overlay, schema, columns, row_group_rows)


def _schema(path: Path, meta: dict[bytes, bytes] | None, split: str) -> tuple[pa.Schema, dict[str, Any]]:
    """The compacted shards' schema: the source's (as convert builds it, tasks/convert/stage.py) with `curation`
    applied; shards of another convert version or already compacted are refused."""
    own = own_metadata(meta) or {}
    if own.get("curation") == CURATION_APPLIED:
        raise PipelineError(
            f"{path}: expected shards as the convert stage writes them (curation by overlay), found shards compacted "
            "already (metadata curation: 'applied'); compact the shards of paths.parquet"
        )
    label_map = label_map_from_metadata(meta, path)
    fingerprinted = own.get("fingerprint_algorithm") is not None
    schema = shard_schema(label_map, own.get("convert_params") or {}, split, fingerprinted, curation=CURATION_APPLIED)
    rebuilt = {k: v for k, v in (own_metadata(schema.metadata) or {}).items() if k != "curation"}
    same_hf = schema.metadata[b"huggingface"] == (meta or {}).get(b"huggingface")
    if not same_hf or rebuilt != {k: v for k, v in own.items() if k != "curation"}:
        raise PipelineError(
            f"{path}: expected the {split} shard metadata this version's convert writes (format {FORMAT_VERSION}), "
            "found other metadata (another version, or an altered footer); re-run `dvc repro convert curate`"
        )
    return schema, label_map


def write_split(out: Path, plan: SplitPlan) -> dict[str, Any]:
    """`out/<split>/` replaced whole by the compacted shards; what was written."""
    written, start = [], 0
    with atomic_path(out / plan.split) as tmp:
        tmp.mkdir()
        for path, rows in plan.files:
            keep = plan.overlay.keep[start : start + rows]
            labels = plan.overlay.labels[start : start + rows]
            start += rows
            if keep.any():  # a shard whose rows all go away is dropped
                count, md5 = write_shard(
                    tmp / path.name, plan.schema, plan.row_group_rows, _rows(path, keep, labels, plan.columns)
                )
                written.append([path.name, count, md5])
    return {
        "overlay_sha256": plan.overlay.digest,
        "rows_in": start,
        "rows": sum(n for _, n, _ in written),
        "shards": written,
        "dropped_shards": sorted({p.name for p, _ in plan.files} - {name for name, _, _ in written}),
        **plan.overlay.edits,
    }


def _rows(
    path: Path, keep: np.ndarray, labels: np.ndarray, columns: list[tuple[str | None, str]]
) -> Iterator[dict[str, Any]]:
    """The kept rows of the shard at `path` in file order, one source row group in memory at a time, with the
    overlay's label and that label's wnid and name."""
    file, start = pq.ParquetFile(path), 0
    for group in range(file.num_row_groups):
        table = file.read_row_group(group, use_threads=False)
        mask = keep[start : start + len(table)]
        now = labels[start : start + len(table)][mask]
        start += len(table)
        for row, label in zip(table.filter(pa.array(mask)).to_pylist(), now.tolist(), strict=True):
            row["label"], (row["wnid"], row["label_name"]) = label, columns[label]
            yield row
    if start != len(keep):
        raise PipelineError(f"{path}: expected {len(keep)} rows (as the overlay says), found {start}; {TODO}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.curate.compact", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="the project's params.yaml (default: ./params.yaml)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory inside the project ({DEFAULT_OUT})")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        job = job_from_params(load_project(args.params), args.out)
        report = compact(job)
    except (PipelineError, FormatError) as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    rows = sum(s["rows_in"] for s in report["splits"].values())
    for split, s in report["splits"].items():
        print(f"{split}: {s['rows']} of {s['rows_in']} rows in {len(s['shards'])} shards -> {job.out / split}")
    print(f"compact: {seconds:.1f} s, {rows / max(seconds, 1e-9):.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

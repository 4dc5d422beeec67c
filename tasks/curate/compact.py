"""Compaction: the curation overlay folded into shards (`python -m tasks.curate.compact`, `make compact`), for
whoever wants shards that any Parquet tool reads with the current labels (pandas, Hugging Face `datasets`, Spark).

Per split, the shards of `paths.parquet` and their overlay (`paths.overlay`, checked against them: a stale one is
refused) become `<out>/<split>/` (default `data/compacted`, git-ignored; inside the project): the same shard names
and row order, the excluded rows dropped (a shard left empty is dropped), `label`/`wnid`/`label_name` the
overlay's, metadata `curation: applied` (readers apply no overlay to them) and the footer byte index written anew.
The rows go through the shard writer convert uses (tasks/common/shard_writer.py: the same settings, deterministic
bytes; one writer shared by both packages, not a second one). `<out>` is only ever a directory compaction owns (new,
or written by it before) and is replaced whole: every split and `<out>/compaction.json` (the overlay each split was
compacted from) are published as one set (tasks/curate/compact_out.py)."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import (
    FORMAT_VERSION,
    GENERATION_KEY,
    FormatError,
    class_names,
    label_map_from_metadata,
    own_metadata,
    shard_schema,
)
from imagenet_parquet.overlay import CURATION_APPLIED, Overlay, load_overlay
from tasks.common import SPLITS, PipelineError, write_json
from tasks.common.params import Project, load_project
from tasks.common.shard_writer import write_shard
from tasks.curate.compact_out import DEFAULT_OUT, REPORT, NewSet, check_out, new_set
from tasks.curate.stage import read_split

TODO = "run `dvc repro curate` (or `dvc pull` the shards and data/overlay of one version together), then compact again"


@dataclass(frozen=True)
class CompactJob:
    root: Path
    parquet: Path
    overlay: Path
    out: Path
    owned: dict[str, dict[str, int]] = field(default_factory=dict)  # the files of `out` it wrote (check_owned)


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
    """The job; `out` (relative: to the project) must be a directory compaction owns (compact_out.check_out)."""
    target, owned = check_out(project, out)
    return CompactJob(project.root.resolve(), project.path("parquet"), project.path("overlay"), target, owned)


def compact(job: CompactJob) -> dict[str, Any]:
    """Every split compacted into `job.out`, published as one set; returns (and writes as compaction.json) what
    was done."""
    plans = [plan_split(job, split) for split in SPLITS]  # every overlay checked before anything is written
    source = Path(os.path.relpath(job.parquet.resolve(), job.root)).as_posix()  # no machine path in the output
    with new_set(job.out, job.owned) as written:
        report = {"source": source, "splits": {plan.split: write_split(written, plan) for plan in plans}}
        text = write_json(written.path / REPORT, report).read_bytes()
        written.wrote(REPORT, hashlib.md5(text).hexdigest())
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
    if overlay.label_map is not None:  # format 2 (appended shards, issue 33): the labels follow the overlay's map
        label_map = overlay.label_map
        schema = _with_label_map(schema, label_map, split)
    columns = [(c.get("wnid"), n) for c, n in zip(label_map["classes"], class_names(label_map), strict=True)]
    return SplitPlan(split, files, overlay, schema, columns, row_group_rows)


def _with_label_map(schema: pa.Schema, label_map: dict[str, Any], split: str) -> pa.Schema:
    """The compacted shards' schema with `label_map` (a format-2 overlay's: the current one) in place of the
    source shards' own: their labels, wnids and names are the overlay's."""
    own = own_metadata(schema.metadata) or {}
    fingerprinted = own.get("fingerprint_algorithm") is not None
    return shard_schema(label_map, own.get("convert_params") or {}, split, fingerprinted, curation=CURATION_APPLIED)


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
    ignored = ("curation", GENERATION_KEY)  # a compacted shard is no appended one: no generation
    rebuilt = {k: v for k, v in (own_metadata(schema.metadata) or {}).items() if k not in ignored}
    same_hf = schema.metadata[b"huggingface"] == (meta or {}).get(b"huggingface")
    if not same_hf or rebuilt != {k: v for k, v in own.items() if k not in ignored}:
        raise PipelineError(
            f"{path}: expected the {split} shard metadata this version's convert writes (format {FORMAT_VERSION}), "
            "found other metadata (another version, or an altered footer); re-run `dvc repro convert curate`"
        )
    return schema, label_map


def write_split(out: NewSet, plan: SplitPlan) -> dict[str, Any]:
    """`<split>/` of the set being written (compact_out.new_set) made of the compacted shards; what was written."""
    written, start = [], 0
    (out.path / plan.split).mkdir()
    for path, rows in plan.files:
        keep = plan.overlay.keep[start : start + rows]
        labels = plan.overlay.labels[start : start + rows]
        start += rows
        if keep.any():  # a shard whose rows all go away is dropped
            shard = out.path / plan.split / path.name
            count, md5 = write_shard(shard, plan.schema, plan.row_group_rows, _rows(path, keep, labels, plan.columns))
            out.wrote(f"{plan.split}/{path.name}", md5)
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
        job = job_from_params(load_project(args.params), args.out)  # params.yaml: one line if bad
        report = compact(job)
    except (PipelineError, FormatError) as err:  # FormatError: OverlayError too
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full or read-only disk, a file that cannot be read
        found = os.strerror(err.errno) if err.errno else str(err)
        print(
            f"\nerror: {err.filename or args.out}: expected to read or write it while compacting into {args.out}, "
            f"found {found} (errno {err.errno}); free some space or fix its permissions, then compact again "
            "(the previous compacted set, if any, is kept)",
            file=sys.stderr,
        )
        return 1
    seconds = time.perf_counter() - started
    rows = sum(s["rows_in"] for s in report["splits"].values())
    for split, s in report["splits"].items():
        print(f"{split}: {s['rows']} of {s['rows_in']} rows in {len(s['shards'])} shards -> {job.out / split}")
    print(f"compact: {seconds:.1f} s, {rows / max(seconds, 1e-9):.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

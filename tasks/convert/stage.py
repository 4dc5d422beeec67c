"""Parquet conversion: manifests + label map -> data/parquet/<split>/<split>-h<hash>.parquet (rows in hashed order).

`prepare` orders each split's rows (`convert.order`) and plans shards (content-defined, from the manifests alone:
tasks/convert/plan.py), `convert_shard` reads a shard's images a row group at a time in archive-offset order and writes
one shard streaming row groups (resuming: a shard finished for the same plan is kept), `finalize` writes
bad_images.jsonl and the metrics. `tasks.convert.distribute` runs them over processes or Dask workers."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import PIL
import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import (
    FINGERPRINT_ALGORITHM,
    FORMAT_VERSION,
    class_ids,
    class_names,
    read_label_map,
    shard_schema,
)
from tasks.common import SPLITS, PipelineError, atomic_path, disk_errors, dumps_json, write_json, write_text
from tasks.common.dvc_state import stat_key, state_put
from tasks.common.layout import BAD_IMAGES
from tasks.common.manifests import MANIFEST_SCHEMA, dictionary_columns, read_columns
from tasks.common.params import path_key
from tasks.common.progress import Progress as _Bar
from tasks.common.shard_writer import write_shard
from tasks.convert.fingerprint import stored_fingerprint
from tasks.convert.history import SplitHistory, known_rows, merged, new_rows, read_history, usable, write_history
from tasks.convert.imaging import BadImage, Encoded, encode_image
from tasks.convert.inputs import check_labels, read_all
from tasks.convert.job import Job
from tasks.convert.listed import check_md5s
from tasks.convert.plan import Rows, ShardPlan, finished_stats, ordered, plan_split, remove_stale
from tasks.convert.relink import keep, restore_finished, restore_listed
from tasks.convert.sources import Sources

MANIFEST_COLUMNS = [f.name for f in MANIFEST_SCHEMA if f.name != "split"]  # what convert reads of a manifest


def prepare(job: Job) -> list[ShardPlan]:
    """Validate the inputs, plan the shards to write — every split's, or with a layout history only the images no
    listed shard holds (tasks/convert/history.py) — and drop files of older plans from the output dirs."""
    label_map = read_label_map(job.label_map)
    wnid_label = {name: label for label, name in enumerate(class_ids(label_map))}  # the manifests' class key
    history = read_history(job.layout, _identity(job)) or {}
    vouched = restore_listed(job, {split: history[split].shards for split in job.splits() if split in history})
    plans: list[ShardPlan] = []
    for split in job.splits():
        table = _manifest(job.manifest(split))
        check_labels(job.manifest(split), table, wnid_label)
        split_plans, listed = _plan(job, split, table, history.get(split), vouched)
        remove_stale(job.parquet / split, {p.name for p in split_plans} | listed)
        remove_stale(
            job.scratch(split),
            {path.name for p in split_plans for path in (job.stats_path(p), job.rows_path(p), job.resume_path(p))},
        )
        plans += split_plans
    for split in sorted(set(SPLITS) - set(job.splits())):  # a split no longer in the manifests
        remove_stale(job.parquet / split, set())
    if not job.splits():
        raise PipelineError(
            f"{job.manifests}: expected manifests {[f'{s}.parquet' for s in SPLITS]}, found none; "
            "run the extract stage first (`dvc repro extract`)"
        )
    _check_free_space(job, plans)
    return plans


def _plan(
    job: Job, split: str, table: pa.Table, history: SplitHistory | None, vouched: set[Path]
) -> tuple[list[ShardPlan], set[str]]:
    """One split's plans and the shard names its history lists: the canonical layout without a history, else the
    new rows alone as generation g + 1 (none when nothing is new); `prepare` has linked back the listed shards DVC
    deleted (`vouched`: from a source named by their md5), each held to the history before its rows count."""
    history = usable(history, job.parquet / split, split)
    if history is None:
        rows = ordered(table, job.order)
        plans = plan_split(split, rows, job.target_bytes, _base_key(job), order=job.order)
        _write_slices(job, rows, plans)
        return plans, set()
    listed = {s["name"] for s in history.shards}
    known = known_rows(job.parquet, split, history, job.layout)
    check_md5s(job, split, history.generations, vouched)
    fresh = new_rows(table, known, history.bad_keys())
    if not fresh.any():
        return [], listed
    generation = history.next_generation
    rows = ordered(table.filter(pa.array(fresh)), job.order)
    base = f"{_base_key(job)}:g{generation}:{history.digest()}"
    plans = [
        replace(p, stem=f"g{generation}-{p.stem}", generation=generation)
        for p in plan_split(split, rows, job.target_bytes, base, order=job.order)
    ]
    _write_slices(job, rows, plans)
    return plans, listed


def convert_shard(job: Job, plan: ShardPlan) -> dict[str, Any]:
    """Write one shard (or keep it when a previous run finished it for this exact plan); return its stats."""
    shard, stats_path = job.shard_path(plan), job.stats_path(plan)
    restore_finished(job.resume_path(plan), shard)  # finished by a killed run, then deleted by DVC
    done = finished_stats(plan, shard, stats_path)
    if done is not None:
        return {**done, "resumed": True}
    started = time.perf_counter()
    label_map = read_label_map(job.label_map)
    rows = _rows(job, plan)
    schema = shard_schema(
        label_map,
        job.output_params(),
        plan.split,
        fingerprinted=job.fingerprint,
        curation="overlay",
        generation=plan.generation,
    )
    tally = _Tally(split=plan.split)
    with disk_errors(shard.parent, shard.name, path_key("parquet"), "finished shards are kept"):  # no partial file
        count, md5 = write_shard(
            shard, schema, job.row_group_rows, _encoded_rows(job, rows, _label_columns(label_map), tally)
        )
    stats = {
        "key": plan.key,
        "shard": plan.name,
        "split": plan.split,
        "count": count,
        "bad": tally.bad,
        "bad_classes": tally.bad_classes,  # the class id of each bad image (the layout history's identity)
        "input_bytes": plan.input_bytes,
        "image_bytes": tally.image_bytes,
        "file_bytes": shard.stat().st_size,
        "row_groups": pq.read_metadata(shard).num_row_groups,
        "md5": md5,  # with the file's stat when hashed: finalize hands it to DVC's state (no second hash)
        "stat": stat_key(shard),
        "seconds": round(time.perf_counter() - started, 3),
    }
    keep(shard, job.resume_path(plan))
    write_json(stats_path, stats, path_key("work"))
    return {**stats, "resumed": False}


def finalize(job: Job, plans: list[ShardPlan], results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Write the layout history, bad_images.jsonl (every generation's, in plan order) and the metrics (the whole
    split: every generation); fail when bad images exceed max_bad_fraction."""
    by_shard = {(r["split"], r["shard"]): r for r in results}
    ordered = [_with_md5(job, p, by_shard[(p.split, p.name)]) for p in plans]
    history = read_history(job.layout, _identity(job), quiet=True) or {}
    splits = {split: merged(history.get(split), plans, ordered, split) for split in job.splits()}
    bad = [b["record"] for gens in splits.values() for g in gens for b in g["bad"]]
    lines = "".join(json.dumps(b, sort_keys=True) + "\n" for b in bad)
    write_text(job.parquet / BAD_IMAGES, lines, path_key("parquet"))
    write_history(job.layout, _identity(job), splits)
    metrics = _metrics(splits)
    write_json(job.metrics, metrics, path_key("metrics"))  # DVC-hashed (dvc.lock): counts only, same inputs same bytes
    timings = _timings(ordered, seconds)  # vary run to run: scratch, not tracked
    write_json(job.work / "logs" / "convert.json", timings, path_key("work"))
    print(f"convert: {timings['seconds']:.1f} s, {timings['images_per_s']} img/s, {timings['mb_per_s']} MB/s")
    _check_bad_fraction(job, metrics)
    state_put((job.shard_path(p), r["md5"], r["stat"]) for p, r in zip(plans, ordered, strict=True) if "stat" in r)
    return {**metrics, **timings}


def _with_md5(job: Job, plan: ShardPlan, result: dict[str, Any]) -> dict[str, Any]:
    """A shard's result with its md5 (stats of an older run may lack it: the file is hashed then)."""
    if "md5" in result:
        return result
    with open(job.shard_path(plan), "rb") as fh:
        return {**result, "md5": hashlib.file_digest(fh, "md5").hexdigest()}


class Progress:
    """Progress bar over images (shard granularity): images, MB/s, ETA."""

    def __init__(self, plans: list[ShardPlan], enabled: bool = True) -> None:
        self.started = time.perf_counter()
        self.bytes = 0
        self.bar = _Bar(sum(p.stop - p.start for p in plans), "convert", unit="img", enabled=enabled)

    def update(self, stats: dict[str, Any]) -> dict[str, Any]:
        self.bytes += stats["input_bytes"]
        mb_s = self.bytes / 1e6 / max(time.perf_counter() - self.started, 1e-9)
        self.bar.update(stats["count"] + len(stats["bad"]), postfix=f"{mb_s:.1f} MB/s")
        return stats

    def close(self) -> None:
        self.bar.close()


@dataclass
class _Tally:
    split: str
    image_bytes: int = 0
    bad: list[dict[str, str]] = field(default_factory=list)
    bad_classes: list[str] = field(default_factory=list)


def _label_columns(label_map: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(wnid — null for a dataset not named by wnids —, label_name) by label, as the shard rows carry them."""
    return [(c["wnid"], name) for c, name in zip(label_map["classes"], class_names(label_map), strict=True)]


def _encoded_rows(
    job: Job, rows: list[dict[str, Any]], names: list[tuple[str | None, str]], tally: _Tally
) -> Iterator[dict[str, Any]]:
    """Read the images through the manifest (pread, a row group's worth at a time in archive-offset order), apply
    the policy, yield rows in the shard's order and the schema's layout."""
    with Sources(job.root) as sources:
        for group, images in sources.groups(rows, job.row_group_rows):
            for row, data in zip(group, images, strict=True):
                try:
                    enc = encode_image(data, job.policy)
                    phash = stored_fingerprint(enc.data) if job.fingerprint else None  # of the stored bytes
                except BadImage as err:
                    tally.bad.append(
                        {
                            "split": tally.split,
                            "source": row["source"],
                            "member": row["member"],
                            "name": row["name"],
                            "reason": str(err),
                        }
                    )
                    tally.bad_classes.append(row["wnid"])
                    continue
                tally.image_bytes += len(enc.data)
                yield _shard_row(row, enc, phash, names)


def _shard_row(
    row: dict[str, Any], enc: Encoded, phash: int | None, names: list[tuple[str | None, str]]
) -> dict[str, Any]:
    return {
        "image": {"bytes": enc.data, "path": row["name"]},
        "label": row["label"],
        "wnid": names[row["label"]][0],
        "label_name": names[row["label"]][1],
        "width": enc.width,
        "height": enc.height,
        "source_format": enc.source_format,
        "transform": enc.transform,
        "exif_orientation": enc.exif_orientation,
        "sha256": hashlib.sha256(enc.data).hexdigest(),
        "phash": phash,
    }


def _manifest(path: Path) -> pa.Table:
    """The manifest columns convert needs, read once by the planner (`read_columns`: one chunk per column, the
    repeated strings as dictionaries — ~0.9 of the file's decoded size, never two copies of it)."""
    try:
        return read_columns(path, MANIFEST_COLUMNS, dictionary_columns(path))
    except (OSError, pa.ArrowInvalid, KeyError) as err:
        raise PipelineError(
            f"{path}: expected a manifest with columns {MANIFEST_COLUMNS} (docs/CONTRACTS.md), "
            f"found: {err}; re-run the extract stage"
        ) from None


def _write_slices(job: Job, rows: Rows, plans: list[ShardPlan]) -> None:
    """Each shard's manifest rows in a small file next to its stats: a worker reads only its own rows, so worker
    memory does not grow with the manifest (1.28M rows for ImageNet train)."""
    for plan in plans:
        with atomic_path(job.rows_path(plan), path_key("work")) as tmp:
            pq.write_table(rows.slice(plan.start, plan.stop), tmp)


def _rows(job: Job, plan: ShardPlan) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = read_all(job.rows_path(plan)).to_pylist()
    if len(rows) != plan.stop - plan.start:
        raise PipelineError(
            f"{job.rows_path(plan)}: expected {plan.stop - plan.start} manifest rows for "
            f"{plan.name}, found {len(rows)}; another run is using the same work directory?"
        )
    return rows


def _base_key(job: Job) -> str:
    """Identity of the inputs all shards share and the output-relevant params (each shard's key adds its own
    manifest rows: a shard whose rows did not change is kept); a shard finished under another key is redone."""
    return _sha256({"label_map": _digest(job.label_map), **_output_identity(job)})


def _identity(job: Job) -> str:
    """What the shards of every generation share (not the label map, which an appended generation may change): a
    layout history written under another identity is dropped."""
    return _sha256(_output_identity(job))


def _output_identity(job: Job) -> dict[str, Any]:
    return {
        "params": job.output_params(),
        "format": FORMAT_VERSION,
        "fingerprint_algorithm": FINGERPRINT_ALGORITHM,  # new bits for the same bytes: every shard redone
        "pyarrow": pa.__version__,
        "pillow": PIL.__version__,
    }


def _sha256(identity: dict[str, Any]) -> str:
    return hashlib.sha256(dumps_json(identity).encode()).hexdigest()


def _digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _metrics(splits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per split its rows, bad images, shards and bytes over every generation (and how many generations, when
    images were appended)."""
    out: dict[str, dict[str, int]] = {}
    for split, generations in splits.items():
        shards = [s for g in generations for s in g["shards"]]
        out[split] = {
            "rows": sum(s["rows"] for s in shards),
            "bad_images": sum(len(g["bad"]) for g in generations),
            "shards": len(shards),
            **{key: sum(s[key] for s in shards) for key in ("image_bytes", "file_bytes", "input_bytes")},
        }
        if len(generations) > 1:
            out[split]["generations"] = len(generations)
            out[split]["appended_rows"] = sum(s["rows"] for g in generations[1:] for s in g["shards"])
    return {
        "splits": out,
        "rows": sum(s["rows"] for s in out.values()),
        "bad_images": sum(s["bad_images"] for s in out.values()),
    }


def _timings(results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """How fast this run was (and how much it resumed): `<paths.work>/logs/convert.json`, never a DVC metric."""
    fresh = [r for r in results if not r["resumed"]]
    done = sum(r["count"] + len(r["bad"]) for r in fresh)
    return {
        "resumed_shards": len(results) - len(fresh),
        "seconds": round(seconds, 3),
        "images_per_s": round(done / seconds, 1) if seconds > 0 else 0.0,
        "mb_per_s": round(sum(r["input_bytes"] for r in fresh) / 1e6 / seconds, 1) if seconds > 0 else 0.0,
    }


SPACE_MARGIN = 64 << 20  # room left for everything else on the disk


def _check_free_space(job: Job, plans: list[ShardPlan]) -> None:
    """Fail before converting when the shards still to write (about their input size) do not fit on the disk."""
    present = sum(job.shard_path(p).stat().st_size for p in plans if job.shard_path(p).is_file())
    needed = max(0, sum(p.input_bytes for p in plans) - present)
    job.parquet.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(job.parquet).free
    if needed + SPACE_MARGIN > free:
        raise PipelineError(
            f"{job.parquet}: expected {needed:,} bytes free for the shards (+ {SPACE_MARGIN >> 20} MiB margin; "
            f"about the images' input size), found {free:,} bytes free; free some space or point paths.parquet "
            "at a larger disk, then run again"
        )


def _check_bad_fraction(job: Job, metrics: dict[str, Any]) -> None:
    for split, s in metrics["splits"].items():
        total = s["rows"] + s["bad_images"]
        fraction = s["bad_images"] / total if total else 0.0
        if fraction > job.max_bad_fraction:
            raise PipelineError(
                f"{job.parquet / BAD_IMAGES}: expected at most max_bad_fraction={job.max_bad_fraction} bad images "
                f"in split '{split}', found {s['bad_images']} of {total} ({fraction:.4%}); inspect the reasons "
                "in that file, fix or drop the sources, or raise `convert.max_bad_fraction` in params.yaml"
            )

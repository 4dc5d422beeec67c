"""Curate stage: the curation lines (params.yaml `curate:`) as the overlay every reader applies — the shards are
never rewritten for them (docs/CONTRACTS.md, "Curation overlay").

`job_from_params` reads and checks both files (their form, before any shard is read); `write_overlays` reads each
split's shards once — the footer, the image names and the labels as converted, never an image byte —, finds the
image each line names (`<file>:<line>` fails when the source has no such image), checks the classes the lines
leave (`lines.check_classes`), and writes `<paths.overlay>/<split>.parquet` (imagenet_parquet/overlay.py) and
`curation.json` (what was applied, by reason and class).

Appended shards (issue 33, docs/CONTRACTS.md "Appends"): a split's shards may be of several generations, each with
the label map current when it was written. Each row's identity is (class id from its own shard's label map, name)
(tasks/common/generations.py); an identity the current manifest no longer lists is excluded as `removed from
source`, an older row of an identity a newer generation holds as `replaced by a newer version`, and every label is
the row's class in the current label map. The overlay is then format 2 (it carries label_map.json's label map);
with one generation, the current label map and nothing removed it is format 1, byte for byte what it always was."""

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

from imagenet_parquet.format import FormatError, class_ids, read_label_map
from imagenet_parquet.overlay import footer_digest, footer_tail, overlay_table, write_overlay
from tasks.common import SPLITS, PipelineError, atomic_path, write_json
from tasks.common.generations import (
    REMOVED,
    REPLACED,
    ShardClasses,
    by_class,
    coded_ids,
    current_lookup,
    identity_keys,
    in_source,
    newest_rows,
    shard_classes,
)
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
    """A split's shards as converted: [(name, rows, footer sha256)], every row's image name and label (as stored,
    in its own shard's label map). Over shards of several label maps (tasks/common/generations.py) `codes` gives
    each row's class id as an index into `vocab` (None: the labels index the label map's class ids); `generations`
    each shard's (None: all 0); `same_map`: every shard has the current label map."""

    shards: list[tuple[str, int, str]]
    names: pa.Array
    labels: np.ndarray
    vocab: list[str] | None = None
    codes: np.ndarray | None = None
    generations: list[int] | None = None
    same_map: bool = True

    def class_codes(self) -> np.ndarray:
        return self.labels if self.codes is None else self.codes

    def row_generations(self) -> np.ndarray | None:
        """The generation of every row, or None when all shards are of one generation."""
        if not self.generations or min(self.generations) == max(self.generations):
            return None
        return np.repeat(np.asarray(self.generations, dtype=np.int64), [n for _, n, _ in self.shards])


@dataclass
class SourceRows:
    """A split's rows against the current source: the label now (current label map, by class id; -1: a class it
    no longer has), the newest row of each identity (None: all) and the identities the current manifest lists
    (None: all)."""

    current: np.ndarray
    newest: np.ndarray | None = None
    listed: np.ndarray | None = None

    @property
    def kept(self) -> np.ndarray:
        kept = np.ones(len(self.current), dtype=bool)
        for mask in (self.newest, self.listed):
            if mask is not None:
                kept &= mask
        return kept


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


def read_split(parquet: Path, split: str, label_map: dict[str, Any] | None = None) -> SplitRows:
    """The shards of `split` in name order (as readers sort them): footer digest, names and labels of every row,
    each shard's generation and label map (class ids: `SplitRows`); `label_map`: the current one."""
    files = sorted((parquet / split).glob("*.parquet"))
    if not files:
        raise PipelineError(
            f"{parquet / split}: expected the {split} shards written by the convert stage, found none; run "
            "`dvc repro convert`"
        )
    shards, names, labels, owns = [], [], [], []
    seen: dict[Any, ShardClasses] = {}
    for path in files:
        file = pq.ParquetFile(path)
        table = file.read(columns=["image.path", "label"], use_threads=False)
        shards.append((path.name, file.metadata.num_rows, footer_digest(footer_tail(path))))
        names.append(table.column("image").combine_chunks().field("path"))
        labels.append(table.column("label").to_numpy())
        owns.append(_shard_classes(path, file.schema_arrow.metadata, seen))
    stored = np.concatenate(labels).astype(np.int64)
    vocab, codes = _codes(owns, labels)
    same = label_map is None or all(own.label_map == label_map for own in {id(o): o for o in owns}.values())
    return SplitRows(shards, pa.concat_arrays(names), stored, vocab, codes, [o.generation for o in owns], same)


def _codes(owns: list[ShardClasses], labels: list[np.ndarray]) -> tuple[list[str], np.ndarray | None]:
    """The class ids of the split and every row's index into them: the shards' own when they share one label map
    (codes None: the labels), else their union in order of appearance."""
    if all(own.ids == owns[0].ids for own in owns):
        return owns[0].ids, None
    vocab = list(dict.fromkeys(i for own in owns for i in own.ids))
    index = {name: code for code, name in enumerate(vocab)}
    lookups = [np.asarray([index[i] for i in own.ids], dtype=np.int64) for own in owns]
    return vocab, np.concatenate([lookup[part.astype(np.int64)] for lookup, part in zip(lookups, labels, strict=True)])


def _shard_classes(path: Path, meta: dict[bytes, bytes] | None, seen: dict[Any, ShardClasses]) -> ShardClasses:
    try:
        return shard_classes(meta, path, seen)
    except FormatError as err:
        raise PipelineError(f"{err} (the curate stage reads each shard's own label map)") from None


def source_rows(rows: SplitRows, current: list[str], manifests: Path, split: str) -> SourceRows:
    """`rows` against the current label map (class ids `current`) and the current manifest of `split` (none:
    every row is taken as listed). Arrow and numpy columns only: no Python object per row."""
    vocab, codes = rows.vocab or current, rows.class_codes()
    lookup = current_lookup(vocab, current)
    labels = codes if np.array_equal(lookup, np.arange(len(lookup))) else lookup[codes]
    generations, path = rows.row_generations(), manifest_path(manifests, split)
    if generations is None and not path.is_file():  # shards curated without their manifests: nothing removed
        return SourceRows(labels)
    keys = identity_keys(coded_ids(codes, vocab), rows.names)
    newest = None if generations is None else newest_rows(keys, generations)
    listed = in_source(keys, pq.read_table(path, columns=["wnid", "name"])) if path.is_file() else None
    return SourceRows(labels, newest, listed)


def _positions(
    rows: SplitRows, ids: list[str], newest: np.ndarray | None, lines: list[Line]
) -> dict[tuple[str, str], int]:
    """(class, name) -> global row of the newest row of that identity, for the rows whose name a line names only
    (no Python object per row)."""
    wanted = pa.array(sorted({line.name for line in lines}), pa.string())
    named = pc.is_in(rows.names, value_set=wanted).to_numpy(zero_copy_only=False)
    found = np.flatnonzero(named if newest is None else named & newest)
    names = rows.names.take(pa.array(found, pa.int64())).to_pylist()
    vocab, codes = rows.vocab or ids, rows.class_codes()
    return {(vocab[int(codes[i])], name): int(i) for i, name in zip(found, names, strict=True)}


def apply_lines(
    split: str,
    rows: SplitRows,
    ids: list[str],
    curation: Curation,
    manifests: Path,
    source: SourceRows | None = None,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(labels, keep) of every row of `split` with its lines applied, and the lines whose image convert
    quarantined (in the manifest, not in the shards: nothing to apply). A line naming no image fails. `source`
    (`source_rows`): the labels start from its labels in the current map (`ids`), its rows replaced or removed from
    the source are not kept, and a line names the newest row of its image; None: the labels as stored, all kept."""
    source = source or SourceRows(rows.labels)
    exclude = [line for line in curation.exclude if line.split == split]
    relabel = [line for line in curation.relabel if line.split == split]
    index = _class_index(ids, exclude + relabel)
    position = _positions(rows, ids, source.newest, exclude + relabel)
    missing = [line for line in exclude + relabel if (line.wnid, line.name) not in position]
    quarantined = _quarantined(manifests, split, missing)
    labels, keep = source.current.copy(), source.kept
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
    label_map = read_label_map(job.label_map)
    ids = class_ids(label_map)
    held = "holdout" in _extract_report(job.manifests)
    found: dict[str, dict[str, set[str]]] = {"before": {}, "after": {}}
    overlays, quarantined, sources = {}, [], {}
    for split in SPLITS:
        overlays[split], missing, sources[split] = split_overlay(job, split, label_map, found)
        quarantined += missing
    curation_lines.check_classes(job.curation, found, ids, held)
    report = _report(job.curation, quarantined)
    if any(sources.values()):  # appended or removed rows: what the source changed, by reason and class
        report["source"] = {split: sources[split] or source_counts(None) for split in SPLITS}
    with atomic_path(job.overlay, path_key("overlay")) as tmp:  # published whole: a kill never mixes two versions
        tmp.mkdir()
        for split, table in overlays.items():
            write_overlay(table, tmp / f"{split}.parquet")
        write_json(tmp / CURATION_REPORT, report)
    return report


def split_overlay(
    job: CurateJob, split: str, label_map: dict[str, Any], found: dict[str, dict[str, set[str]]]
) -> tuple[pa.Table, list[dict[str, Any]], dict[str, Any] | None]:
    """The overlay of `split` (format 1 when its shards are one generation with the current label map and the
    source removed nothing: today's bytes; else format 2 with `label_map`), the lines naming quarantined images,
    and (format 2) the rows the source removed, replaced and appended (`source_counts`). Fills `found` with the
    classes before and after the lines."""
    ids = class_ids(label_map)
    rows = read_split(job.parquet, split, label_map)
    source = source_rows(rows, ids, job.manifests, split)
    labels, keep, missing = apply_lines(split, rows, ids, job.curation, job.manifests, source)
    vocab, codes = rows.vocab or ids, rows.class_codes()
    _check_kept(job, split, rows, vocab, labels, keep)
    found["before"][split] = {vocab[int(c)] for c in np.unique(codes if _all(source) else codes[source.kept])}
    found["after"][split] = {ids[int(i)] for i in np.unique(labels[keep])}
    edits = {"relabelled": int((labels != source.current).sum()), "excluded": int((~keep).sum())}
    if not any(rows.generations or ()) and rows.same_map and source.newest is None and not _removed(source):
        return overlay_table(split, rows.shards, labels, keep, edits), missing, None
    counts = source_counts((rows, vocab, source, keep))
    extra = {**edits, **{key: counts[reason]["rows"] for key, reason in SOURCE_KEYS.items()}}
    return overlay_table(split, rows.shards, labels, keep, extra, label_map=label_map), missing, counts


def _removed(source: SourceRows) -> bool:
    return source.listed is not None and not bool(source.listed.all())


def _all(source: SourceRows) -> bool:
    return source.newest is None and not _removed(source)


SOURCE_KEYS = {"removed": REMOVED, "replaced": REPLACED, "appended": "appended"}  # overlay metadata -> reason


def source_counts(state: tuple[SplitRows, list[str], SourceRows, np.ndarray] | None) -> dict[str, Any]:
    """Rows removed from the source, replaced by a newer version and appended (generation >= 1, kept), each by
    class id; `state` None: none of them."""
    if state is None:
        return {reason: {"rows": 0, "by_class": {}} for reason in SOURCE_KEYS.values()}
    rows, vocab, source, keep = state
    newest = source.newest if source.newest is not None else np.ones(len(keep), dtype=bool)
    listed = source.listed if source.listed is not None else np.ones(len(keep), dtype=bool)
    generations = rows.row_generations()
    if generations is None:
        generations = np.full(len(keep), (rows.generations or [0])[0], dtype=np.int64)
    masks = {REMOVED: newest & ~listed, REPLACED: ~newest, "appended": keep & (generations > 0)}
    codes = rows.class_codes()
    return {reason: {"rows": int(m.sum()), "by_class": by_class(codes, vocab, m)} for reason, m in masks.items()}


def _check_kept(
    job: CurateJob, split: str, rows: SplitRows, vocab: list[str], labels: np.ndarray, keep: np.ndarray
) -> None:
    """A kept row has a class of the current label map (else the manifest lists an image of a class label_map.json
    does not have: extract's outputs disagree)."""
    bad = np.flatnonzero(keep & (labels < 0))
    if len(bad):
        first = int(bad[0])
        raise PipelineError(
            f"{job.label_map}: expected every class of the {split} manifest, found no class "
            f"{vocab[int(rows.class_codes()[first])]!r} "
            f"(of {rows.names[first].as_py()!r}, listed in {manifest_path(job.manifests, split)}); run `dvc repro "
            "extract` (or `dvc pull` data/manifests and data/label_map.json of one version together)"
        )


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

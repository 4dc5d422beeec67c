"""Curate, validate and compact over appended shards (issue 33, docs/CONTRACTS.md "Appends"): a folder converted by
the convert stage (generation 0), then the folder changed — a new class that sorts first, an image added, one
removed, one modified (new bytes, a new size) — and its new images written as generation-1 shards the way the
convert stage appends them (own metadata `generation: 1`, the label map current then); a relabel line on top.

The curate stage then writes a format-2 overlay whose labels are torchvision ImageFolder's on the new tree, the
removed and replaced rows excluded with their reasons and counted by class; validate checks the merged view and
counts what changed; compaction folds it all into shards with the current label map."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from imagenet_parquet.format import class_ids, label_map_from_metadata, own_metadata, shard_generation, shard_schema
from imagenet_parquet.overlay import OVERLAY_KEY, overlay_table, read_overlay, write_overlay
from tasks.common import SPLITS, PipelineError
from tasks.common.generations import REMOVED, REPLACED
from tasks.common.shard_writer import write_shard
from tasks.convert.distribute import run_local
from tasks.convert.job import job_from_params as convert_job
from tasks.curate import compact as compaction
from tasks.curate import stage
from tasks.curate.lines import read_curation
from tasks.validate import changes
from tasks.validate.stage import run_validation
from tests.helpers.datasets import contract_row, small_jpeg
from tests.helpers.params import project, validate_section
from tests.test_extract import run_folder

BEFORE = {
    "train": {"cat": ["c1.jpg", "c2.jpg"], "dog": ["d1.jpg", "d2.jpg", "d3.jpg"], "fox": ["f1.jpg", "f2.jpg"]},
    "val": {"cat": ["vc.jpg"], "dog": ["vd.jpg"], "fox": ["vf.jpg"]},
}
ADDED = {"train": {"ant": ["a1.jpg", "a2.jpg"], "cat": ["c3.jpg"]}, "val": {"ant": ["va.jpg"]}}
REMOVED_IMAGE = ("train", "dog", "d2.jpg")
MODIFIED_IMAGE = ("train", "cat", "c1.jpg")
RELABEL_LINE = "train,fox,f2.jpg,dog,wrong label\n"


def _write(tree: Path, layout: dict[str, dict[str, list[str]]], seed: int) -> int:
    for split, classes in layout.items():
        for cls, names in classes.items():
            (tree / split / cls).mkdir(parents=True, exist_ok=True)
            for name in names:
                seed += 1
                (tree / split / cls / name).write_bytes(small_jpeg(seed))
    return seed


def _shard_names(data: Path, split: str) -> dict[str, tuple[str, int, int]]:
    """image name -> (class id, label, byte size) of every row of the split's shards (with their own label map)."""
    found = {}
    for path in sorted((data / "parquet" / split).glob("*.parquet")):
        file = pq.ParquetFile(path)
        ids = class_ids(label_map_from_metadata(file.schema_arrow.metadata, path))
        for row in file.read(columns=["image", "label"]).to_pylist():
            found[row["image"]["path"]] = (ids[row["label"]], row["label"], len(row["image"]["bytes"]))
    return found


def _append(tree: Path, data: Path) -> dict[str, list[str]]:
    """The new images of the changed tree (an identity in no shard, or a size that differs from its shard row's)
    written as one generation-1 shard per split, as convert appends them; returns the names appended per split."""
    label_map = json.loads((data / "label_map.json").read_text(encoding="utf-8"))
    ids, names = class_ids(label_map), [c["name"] for c in label_map["classes"]]
    appended = {}
    for split in SPLITS:
        old = _shard_names(data, split)
        first = sorted((data / "parquet" / split).glob("*.parquet"))[0]
        params = (own_metadata(pq.read_schema(first).metadata) or {})["convert_params"]
        rows = []
        for entry in pq.read_table(data / "manifests" / f"{split}.parquet").to_pylist():
            known = old.get(entry["name"])
            if known is not None and known[0] == entry["wnid"] and known[2] == entry["size"]:
                continue
            image = (tree / split / entry["wnid"] / entry["name"]).read_bytes()
            label = ids.index(entry["wnid"])
            rows.append(contract_row(image, entry["name"], label, label_map["classes"][label]["wnid"], names[label]))
        digest = hashlib.sha256("".join(r["image"]["path"] for r in rows).encode()).hexdigest()[:16]
        schema = shard_schema(label_map, params, split, curation="overlay", generation=1)
        write_shard(data / "parquet" / split / f"{split}-g1-h{digest}.parquet", schema, 64, iter(rows))
        appended[split] = sorted(r["image"]["path"] for r in rows)
    return appended


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Generation 0 converted by the stages and curated; then the tree changed, extracted again, its new images
    appended as generation 1. Returns the root, the generation-0 overlay bytes and the names appended."""
    root = tmp_path_factory.mktemp("appends")
    tree, data = root / "tree", root / "data"
    seed = _write(tree, BEFORE, 0)
    run_folder(tree, data)
    run_local(convert_job(project(root).params.convert, project(root).paths, root=data), progress=False)
    job = stage.CurateJob(data / "parquet", data / "manifests", data / "label_map.json", data / "overlay",
                          read_curation(None, None))
    stage.write_overlays(job)
    before = {p.name: p.read_bytes() for p in sorted((data / "overlay").iterdir())}
    shutil.copytree(data, root / "gen0")  # the version before the change, for "what changed"
    _write(tree, ADDED, seed + 100)
    (tree / "/".join(REMOVED_IMAGE)).unlink()
    (tree / "/".join(MODIFIED_IMAGE)).write_bytes(small_jpeg(999) + b"\0" * 7)  # new bytes, another size
    shutil.rmtree(data / "staging", ignore_errors=True)
    run_folder(tree, data)
    return {"root": root, "tree": tree, "data": data, "before": before, "appended": _append(tree, data)}


def _curate(appended: dict[str, Any], tmp: Path, relabel: str = RELABEL_LINE) -> tuple[stage.CurateJob, dict]:
    data = tmp / "data"
    shutil.copytree(appended["data"], data, ignore=shutil.ignore_patterns("overlay", "staging"))
    (tmp / "exclude.csv").write_text("split,wnid,name,reason\n", encoding="utf-8")
    (tmp / "relabel.csv").write_text("split,wnid,name,new_wnid,reason\n" + relabel, encoding="utf-8")
    lines = read_curation(tmp / "exclude.csv", tmp / "relabel.csv",
                          {"exclude": "curation/exclude.csv", "relabel": "curation/relabel.csv"})
    job = stage.CurateJob(data / "parquet", data / "manifests", data / "label_map.json", data / "overlay", lines)
    return job, stage.write_overlays(job)


def _image_folder(tree: Path, split: str) -> dict[str, int]:
    """What torchvision's ImageFolder gives on `tree/split`: name -> label, classes numbered in sorted order."""
    classes = sorted(p.name for p in (tree / split).iterdir() if p.is_dir())
    return {f.name: i for i, cls in enumerate(classes) for f in sorted((tree / split / cls).iterdir())}


def _kept(job: stage.CurateJob, split: str) -> tuple[dict[str, Any], list[tuple[str, int, bool, int]]]:
    """The overlay's metadata and (name, label, keep, generation) of every row, in shard order."""
    meta, table = read_overlay(job.overlay / f"{split}.parquet")
    rows = []
    for path in sorted((job.parquet / split).glob("*.parquet")):
        generation = shard_generation(pq.read_schema(path).metadata)
        names = pq.read_table(path, columns=["image"]).column("image").combine_chunks().field("path").to_pylist()
        rows += [(name, generation) for name in names]
    labels, keep = table.column("label").to_pylist(), table.column("keep").to_pylist()
    return meta, [(n, lab, k, g) for (n, g), lab, k in zip(rows, labels, keep, strict=True)]


def test_the_overlay_of_an_appended_round_gives_imagefolder_labels_and_excludes_removed_and_replaced_rows(
        appended, tmp_path):
    assert appended["appended"] == {"train": ["a1.jpg", "a2.jpg", "c1.jpg", "c3.jpg"], "val": ["va.jpg"]}
    job, report = _curate(appended, tmp_path)
    label_map = json.loads(job.label_map.read_text(encoding="utf-8"))
    assert class_ids(label_map) == ["ant", "cat", "dog", "fox"]  # the new class sorts first: every label shifts
    for split in SPLITS:
        meta, rows = _kept(job, split)
        assert meta["format"] == 2 and meta["label_map"] == label_map
        expected = _image_folder(appended["tree"], split)
        if split == "train":
            expected["f2.jpg"] = class_ids(label_map).index("dog")  # the relabel line
        assert {n: lab for n, lab, k, _ in rows if k} == expected
        assert len([r for r in rows if r[2]]) == len(expected)  # one kept row per image of the tree
    _, rows = _kept(job, "train")
    excluded = sorted((n, lab, g) for n, lab, k, g in rows if not k)
    assert excluded == [("c1.jpg", 1, 0), ("d2.jpg", 2, 0)]  # the old c1 (replaced), d2 (removed): labels now
    meta, _ = _kept(job, "train")
    assert {k: meta[k] for k in ("relabelled", "excluded", "removed", "replaced", "appended")} == {
        "relabelled": 1, "excluded": 2, "removed": 1, "replaced": 1, "appended": 4}
    assert report["source"]["train"] == {
        REMOVED: {"rows": 1, "by_class": {"dog": 1}},
        REPLACED: {"rows": 1, "by_class": {"cat": 1}},
        "appended": {"rows": 4, "by_class": {"ant": 2, "cat": 2}}}
    assert report["source"]["val"][REMOVED]["rows"] == 0 and report["source"]["val"]["appended"]["rows"] == 1
    assert report["relabel"]["train"]["by_class"] == {"fox->dog": 1}
    written = {p.name: p.read_bytes() for p in sorted(job.overlay.iterdir())}
    stage.write_overlays(job)  # deterministic
    assert {p.name: p.read_bytes() for p in sorted(job.overlay.iterdir())} == written


def test_a_line_names_the_newest_row_of_its_image(appended, tmp_path):
    job, _ = _curate(appended, tmp_path, "train,cat,c1.jpg,fox,moved\n")
    _, rows = _kept(job, "train")
    c1 = sorted((g, lab, k) for n, lab, k, g in rows if n == "c1.jpg")
    assert c1 == [(0, 1, False), (1, 3, True)]  # the line moved the modified image; the old row stays replaced


def test_without_appends_the_overlay_is_format_1_as_before(appended):
    assert all(read_overlay_meta(appended["before"][f"{s}.parquet"])["format"] == 1 for s in SPLITS)
    assert "source" not in json.loads(appended["before"]["curation.json"])


def read_overlay_meta(data: bytes) -> dict[str, Any]:
    return json.loads(pq.read_metadata(io.BytesIO(data)).metadata[OVERLAY_KEY])


def _validate(job: stage.CurateJob, **params: Any) -> dict[str, Any]:
    bounds = {"train_count": [1, 10], "val_count": [1, 10], **params}
    return run_validation(job.parquet, job.manifests, job.label_map, validate_section(**bounds), job.overlay)


def _failed(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["message"] for c in report["checks"] if c["status"] != "pass"}


def test_validate_checks_the_merged_view_and_counts_what_changed(appended, tmp_path):
    gen0 = appended["root"] / "gen0"
    first = _validate(stage.CurateJob(gen0 / "parquet", gen0 / "manifests", gen0 / "label_map.json",
                                      gen0 / "overlay", read_curation(None, None)))
    assert _failed(first) == {}
    (tmp_path / "versions").mkdir()
    changes.record_version(tmp_path / "versions", first["version"])
    job, _ = _curate(appended, tmp_path)
    report = _validate(job)
    assert _failed(report) == {}  # schema, pandera, manifests, classes, leakage, near-duplicates over both maps
    train = report["splits"]["train"]
    assert {k: train[k] for k in ("rows", "images", "removed", "replaced", "appended", "relabelled")} == {
        "rows": 11, "images": 9, "removed": 1, "replaced": 1, "appended": 4, "relabelled": 1}
    assert {row["wnid"]: row["train"] for row in report["classes"]} == {"ant": 2, "cat": 3, "dog": 3, "fox": 1}
    found = changes.record_version(tmp_path / "versions", report["version"])
    metrics = json.loads((tmp_path / "versions" / changes.CHANGES_FILE).read_text(encoding="utf-8"))
    assert metrics["new_classes"] == 1 and found["new_classes"] == ["ant"]
    assert {k: metrics["train"][k] for k in ("images_appended", "images_removed_from_source", "images_replaced",
                                             "images_relabelled", "shards_added", "shards_rewritten")} == {
        "images_appended": 4, "images_removed_from_source": 1, "images_replaced": 1, "images_relabelled": 1,
        "shards_added": 1, "shards_rewritten": 0}
    assert metrics["val"]["images_appended"] == 1 and metrics["val"]["shards_rewritten"] == 0


def test_an_overlay_that_keeps_a_removed_row_or_gives_old_labels_fails_naming_it(appended, tmp_path):
    job, _ = _curate(appended, tmp_path)
    meta, table = read_overlay(job.overlay / "train.parquet")
    keep = np.ones(len(table), dtype=bool)
    labels = np.maximum(table.column("label").to_numpy(), 0)
    shards = [tuple(s) for s in meta["shards"]]
    write_overlay(overlay_table("train", shards, labels, keep, {}, label_map=meta["label_map"]),
                  job.overlay / "train.parquet")
    assert "removed from the source or replaced" in _failed(_validate(job))["overlay_matches_shards"]
    write_overlay(overlay_table("train", shards, labels, keep, {}), job.overlay / "train.parquet")
    assert "expected a format-2 overlay" in _failed(_validate(job))["overlay_matches_shards"]


def test_compaction_folds_the_overlay_into_shards_with_the_current_label_map(appended, tmp_path):
    job, _ = _curate(appended, tmp_path)
    out = tmp_path / "compacted"
    report = compaction.compact(compaction.CompactJob(tmp_path, job.parquet, job.overlay, out))
    label_map = json.loads(job.label_map.read_text(encoding="utf-8"))
    for split in SPLITS:
        expected = [(n, lab) for n, lab, k, _ in _kept(job, split)[1] if k]
        rows = []
        for path in sorted((out / split).glob("*.parquet")):
            file = pq.ParquetFile(path)
            assert label_map_from_metadata(file.schema_arrow.metadata, path) == label_map
            assert shard_generation(file.schema_arrow.metadata) == 0
            rows += file.read(columns=["image", "label", "wnid", "label_name"]).to_pylist()
        assert [(r["image"]["path"], r["label"]) for r in rows] == expected
        names = {c["label"]: (c["wnid"], c["name"]) for c in label_map["classes"]}
        assert all((r["wnid"], r["label_name"]) == names[r["label"]] for r in rows)
        assert report["splits"][split]["rows"] == len(expected)


def test_a_line_that_empties_a_class_of_the_current_map_fails_as_before(appended, tmp_path):
    with pytest.raises(PipelineError, match=r"relabel.csv:2: expected class ant left with images in val"):
        _curate(appended, tmp_path, "val,ant,va.jpg,cat,wrong\n")


def test_an_image_removed_from_the_source_alone_is_an_exclusion_and_rewrites_nothing(appended, tmp_path):
    """No new image (convert appends no shard): the removal is a format-2 overlay exclusion, validate passes and
    "what changed" counts one image removed from the source, no shard added or rewritten."""
    gen0 = appended["root"] / "gen0"
    data = tmp_path / "data"
    shutil.copytree(gen0, data, ignore=shutil.ignore_patterns("overlay", "staging"))
    first = _validate(stage.CurateJob(gen0 / "parquet", gen0 / "manifests", gen0 / "label_map.json",
                                      gen0 / "overlay", read_curation(None, None)))
    (tmp_path / "versions").mkdir()
    changes.record_version(tmp_path / "versions", first["version"])
    manifest = pq.read_table(data / "manifests/train.parquet")
    pq.write_table(manifest.filter(pc.not_equal(manifest.column("name"), REMOVED_IMAGE[2])),
                   data / "manifests/train.parquet")
    job = stage.CurateJob(data / "parquet", data / "manifests", data / "label_map.json", data / "overlay",
                          read_curation(None, None))
    report = stage.write_overlays(job)
    meta, rows = _kept(job, "train")
    assert meta["format"] == 2 and [n for n, _, k, _ in rows if not k] == [REMOVED_IMAGE[2]]
    assert report["source"]["train"][REMOVED] == {"rows": 1, "by_class": {"dog": 1}}
    assert _kept(job, "val")[0]["format"] == 1  # val: nothing removed, nothing appended
    second = _validate(job)
    assert _failed(second) == {}
    changes.record_version(tmp_path / "versions", second["version"])
    metrics = json.loads((tmp_path / "versions" / changes.CHANGES_FILE).read_text(encoding="utf-8"))
    assert {k: metrics["train"][k] for k in ("images_removed_from_source", "images_removed", "shards_added",
                                             "shards_rewritten", "images_appended")} == {
        "images_removed_from_source": 1, "images_removed": 1, "shards_added": 0, "shards_rewritten": 0,
        "images_appended": 0}
    assert metrics["new_classes"] == 0


def test_leakage_and_near_duplicates_pair_new_rows_with_old_ones_by_their_own_label_maps(appended, tmp_path):
    """A generation-2 val image (class ant, label 0 now) holding the bytes of generation-0 train c2.jpg (class cat:
    label 0 in its shard's map, 1 now): the pair is found across generations, each side named by its own class."""
    job, _ = _curate(appended, tmp_path)
    data = job.parquet.parent
    label_map = json.loads(job.label_map.read_text(encoding="utf-8"))
    image = (appended["tree"] / "train/cat/c2.jpg").read_bytes()
    params = (own_metadata(pq.read_schema(next((data / "parquet/val").glob("*.parquet"))).metadata) or {})
    schema = shard_schema(label_map, params["convert_params"], "val", curation="overlay", generation=2)
    row = contract_row(image, "dup.jpg", 0, label_map["classes"][0]["wnid"], label_map["classes"][0]["name"])
    write_shard(data / "parquet/val/val-g2-h0000000000000000.parquet", schema, 64, iter([row]))
    manifest = pq.read_table(data / "manifests/val.parquet")
    entry = {**manifest.slice(0, 1).to_pylist()[0], "wnid": "ant", "name": "dup.jpg", "label": 0, "size": len(image)}
    pq.write_table(pa.concat_tables([manifest, pa.Table.from_pylist([entry], schema=manifest.schema)]),
                   data / "manifests/val.parquet")
    stage.write_overlays(job)
    report = _validate(job, leakage_max_pairs=5)
    pairs = [(p["val_name"], p["val_wnid"], p["train_name"], p["train_wnid"], p["cross_class"])
             for p in report["near_duplicates"]["pairs"]]
    assert pairs == [("dup.jpg", "ant", "c2.jpg", "cat", True)]
    assert _failed(report)["leakage"].startswith("1 ")

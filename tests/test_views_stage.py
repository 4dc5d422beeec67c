"""Issue 33 item 4, the views stage (contract C4): a named subset of the converted, curated sample is a small
overlay-shaped file per split — the rows of its classes (the curated class: relabels and exclusions applied) that
match its `where`, labels 0..K-1 in sorted class-id order, its own label map — and no shard is written. Bad specs
fail naming the params key; two runs are byte-identical; a view gone from params.yaml is gone from data/views."""
from __future__ import annotations

import csv
import dataclasses
import fnmatch
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from imagenet_parquet.format import IMAGE_INDEX_KEY, class_ids, read_label_map, stored_label_map
from imagenet_parquet.overlay import OVERLAY_KEY, OverlayError, overlay_table, read_overlay, write_overlay
from tasks.common import ARCHIVES, SPLITS, PipelineError
from tasks.common.params import Project, validate_params
from tasks.convert.distribute import run_local
from tasks.convert.job import job_from_params
from tasks.curate import stage as curate
from tasks.extract import stage as extract
from tasks.views import stage as views
from tests.helpers.params import repo_doc
from tests.helpers.project import REPO

CURATE = {"exclude": "curation/exclude.csv", "relabel": "curation/relabel.csv"}
GLOB = "*[02468].JPEG"  # train <wnid>_<n>.JPEG and val ILSVRC2012_val_<n>.JPEG alike: even numbers
MIN_WIDTH = 400


def setup(root: Path, views_section: dict[str, Any] | None, **paths: str) -> Project:
    """The repository's params at `root` (curation files under root/curation) with this `views:` section."""
    doc = repo_doc()
    doc["paths"] = {**doc["paths"], **paths}
    doc["curate"], doc["views"] = CURATE, views_section
    return Project(root, validate_params(doc))


def shard_rows(parquet: Path, split: str) -> list[dict[str, Any]]:
    """Every row's metadata, shards in name order (no image bytes)."""
    cols = ["image.path", "wnid", "width", "transform"]
    rows = []
    for file in sorted((parquet / split).glob("*.parquet")):
        table = pq.ParquetFile(file).read(columns=cols)
        for i, row in enumerate(table.to_pylist()):
            rows.append({"shard": file.name, "row": i, "path": row["image"]["path"], **row})
    return rows


@pytest.fixture(scope="module")
def sample(sample_release, tmp_path_factory) -> tuple[Path, list[str], dict[str, Any]]:
    """The built-in sample extracted, converted and curated with one exclusion (a row the view would keep) and one
    relabel (a row of a class outside the view moved into it); returns the root, the class ids, the view spec."""
    root = tmp_path_factory.mktemp("views-sample")
    (root / "curation").mkdir()
    for name, header in (("exclude", "split,wnid,name,reason\n"), ("relabel", "split,wnid,name,new_wnid,reason\n")):
        (root / "curation" / f"{name}.csv").write_text(header, encoding="utf-8")
    project = setup(root, {}, raw=str(sample_release))
    where = project.paths
    staging = where["work"] / "extract"
    for split in extract.SPLITS:
        extract.scan_archive_split(split, where["raw"] / ARCHIVES[split], staging, root=root)
    extract.finalize(staging, where["manifests"], where["label_map"], devkit_path=where["raw"] / ARCHIVES["devkit"])
    run_local(job_from_params(project.params.convert, where, root=root), progress=False)
    ids = class_ids(read_label_map(where["label_map"]))
    chosen = [ids[i] for i in (8, 1, 3, 5, 0)]  # listed unsorted: the view sorts them

    def matching(wnid: str) -> str:
        return next(r["path"] for r in shard_rows(where["parquet"], "train") if r["wnid"] == wnid and
                    fnmatch.fnmatchcase(r["path"], GLOB) and r["width"] >= MIN_WIDTH and r["transform"] == "none")

    (root / "curation" / "exclude.csv").write_text(
        f"split,wnid,name,reason\ntrain,{ids[1]},{matching(ids[1])},blurry\n", encoding="utf-8")
    (root / "curation" / "relabel.csv").write_text(
        f"split,wnid,name,new_wnid,reason\ntrain,{ids[7]},{matching(ids[7])},{ids[3]},wrong class\n", encoding="utf-8")
    curate.write_overlays(curate.job_from_params(project))
    spec = {"classes": chosen, "where": [{"column": "path", "glob": GLOB}, {"column": "width", "min": MIN_WIDTH}]}
    return root, ids, spec


def expected(root: Path, ids: list[str], spec: dict[str, Any], split: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, keep) of the view, computed here from the shards and the base overlay as the contract says."""
    _, base = read_overlay(root / "data" / "overlay" / f"{split}.parquet")
    curated, kept = base.column("label").to_pylist(), base.column("keep").to_pylist()
    order = sorted(spec["classes"])
    labels, keep = [], []
    for row, label, base_keep in zip(shard_rows(root / "data" / "parquet", split), curated, kept, strict=True):
        cls = ids[label]
        labels.append(order.index(cls) if cls in order else -1)
        keep.append(base_keep and cls in order and fnmatch.fnmatchcase(row["path"], GLOB) and row["width"] >= MIN_WIDTH)
    return np.array(labels), np.array(keep)


def view_file(path: Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """A view file read with pyarrow directly (this branch's read_overlay refuses overlay format 2)."""
    file = pq.ParquetFile(path)
    table = file.read()
    meta = json.loads(file.metadata.metadata[OVERLAY_KEY])
    return meta, table.column("label").to_numpy(), table.column("keep").to_numpy(zero_copy_only=False)


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def shard_state(parquet: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(parquet)): (p.stat().st_mtime_ns, hashlib.md5(p.read_bytes()).hexdigest())
            for p in sorted(parquet.rglob("*")) if p.is_file()}


def test_a_view_keeps_exactly_its_classes_rows_matching_where_renumbered_and_writes_no_shard(sample, tmp_path):
    root, ids, spec = sample
    parquet = root / "data" / "parquet"
    before = shard_state(parquet)
    job = dataclasses.replace(views.job_from_params(setup(root, {"five": spec})), views_dir=tmp_path / "views")
    report = views.write_views(job)
    assert shard_state(parquet) == before  # no shard written, none touched
    order = sorted(spec["classes"])
    lmap = read_label_map(root / "data" / "label_map.json")
    for split in ("train", "val"):
        meta, labels, keep = view_file(tmp_path / "views" / "five" / f"{split}.parquet")
        want_labels, want_keep = expected(root, ids, spec, split)
        assert np.array_equal(keep, want_keep) and want_keep.sum() > 0
        assert np.array_equal(labels, want_labels)  # 0..K-1 in sorted class-id order; -1 outside the view
        assert [c["wnid"] for c in meta["label_map"]["classes"]] == order
        assert [c["label"] for c in meta["label_map"]["classes"]] == list(range(len(order)))
        by_wnid = {c["wnid"]: c for c in lmap["classes"]}
        assert [c["name"] for c in meta["label_map"]["classes"]] == [by_wnid[w]["name"] for w in order]
        base, _ = read_overlay(root / "data" / "overlay" / f"{split}.parquet")
        assert meta["format"] == 2 and meta["view"] == "five" and meta["base_overlay_sha256"] == base["content_sha256"]
        assert meta["spec"]["classes"] == spec["classes"] and meta["shards"] == base["shards"]
        images = pq.read_table(parquet / split, columns=["image"]).column("image").combine_chunks().field("bytes")
        kept_bytes = sum(len(b) for b, k in zip(images.to_pylist(), keep, strict=True) if k)
        assert report["five"]["splits"][split] == {**report["five"]["splits"][split], "rows": int(keep.sum()),
                                                   "image_bytes": kept_bytes}
    train_labels, train_keep = expected(root, ids, spec, "train")
    curation = {row[1]: row for row in csv.reader((root / "curation" / "relabel.csv").open()) if row[0] == "train"}
    moved = next(iter(curation.values()))  # the relabelled image is in the view, with its new class's view label
    rows = shard_rows(parquet, "train")
    at = next(i for i, r in enumerate(rows) if r["path"] == moved[2] and r["wnid"] == moved[1])
    assert train_keep[at] and train_labels[at] == order.index(moved[3])
    excluded = next(csv.reader((root / "curation" / "exclude.csv").open().readlines()[1:]))
    at = next(i for i, r in enumerate(rows) if r["path"] == excluded[2])
    assert not train_keep[at] and fnmatch.fnmatchcase(excluded[2], GLOB)  # excluded by curation, not by the view
    assert sum(p.stat().st_size for p in (tmp_path / "views").rglob("*") if p.is_file()) < 32_000  # tiny
    assert json.loads((tmp_path / "views" / "views.json").read_text())["views"] == report


def test_two_runs_are_byte_identical_and_a_removed_view_is_gone(sample, tmp_path):
    root, _, spec = sample
    both = {"five": spec, "all-val": {"classes": "all", "splits": ["val"], "where": [{"column": "transform",
                                                                                    "in": ["none"]}]}}
    out = tmp_path / "views"
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, both)), views_dir=out))
    first = tree(out)
    assert sorted(first) == ["all-val/val.parquet", "five/train.parquet", "five/val.parquet", "views.json"]
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, both)), views_dir=out))
    assert tree(out) == first
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, {"five": spec})), views_dir=out))
    assert sorted(tree(out)) == ["five/train.parquet", "five/val.parquet", "views.json"]
    assert all(first[name] == data for name, data in tree(out).items() if name != "views.json")
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, None)), views_dir=out))  # `views:` empty
    assert sorted(tree(out)) == ["views.json"] and json.loads(tree(out)["views.json"])["views"] == {}
    assert not [p for p in tmp_path.iterdir() if p.name != "views"]  # nothing written beside paths.views


@pytest.mark.parametrize("change, message", [
    ({"classes": ["n00000001"]}, (r"params.yaml views.bad.classes: expected classes of the dataset \(10 in the "
                                 r"curated label map, e.g. 'n\d+'\), found 1 it lacks: 'n00000001'")),
    ({"classes": "imagenet100"}, (r"views.bad.classes: expected classes of the dataset .* found \d+ it lacks: .*"
                                 r"imagenet100_cmc.txt")),
    ({"where": [{"column": "colour", "in": ["red"]}]},
     (r"params.yaml views.bad.where\[0\].column: expected a metadata column of the shards \(path, label, wnid, "
     r"label_name, width, .*\), found 'colour'")),
    ({"where": [{"column": "image", "glob": "*"}]}, r"views.bad.where\[0\].column: expected a metadata column"),
    ({"where": [{"column": "width", "glob": "4*"}]},
     r"views.bad.where\[0\]: expected min, max or in on the numeric column width, found glob"),
    ({"where": [{"column": "path", "in": [3]}]}, r"views.bad.where\[0\]: expected in: text values of column path"),
    ({"where": [{"column": "width", "in": [1 << 40]}]},
     r"views.bad.where\[0\]: expected in: integer \(int32\) values of column width, found 1099511627776"),
    ({"where": [{"column": "phash", "min": 1}]}, r"views.bad.where\[0\]: expected in on phash \(a fingerprint"),
    ({"where": [{"column": "width", "min": 100_000}]},
     (r"params.yaml views.bad: expected rows of train in the view, found none \(rows left after each step: curated "
     r"199, classes 199, where\[0\] 0\); widen its classes or where")),
    ({"classes": "curation/missing.txt"}, r"views.bad.classes: expected all, imagenet100 or a file of class names, "
     r"found .curation/missing.txt. \(no such file\)"),
])
def test_a_bad_view_fails_naming_its_key_and_writes_nothing(sample, tmp_path, change, message):
    root, _, _ = sample
    out = tmp_path / "views"
    with pytest.raises(PipelineError, match=message):
        project = setup(root, {"bad": {"classes": "all", **change}})
        views.write_views(dataclasses.replace(views.job_from_params(project), views_dir=out))
    assert not out.exists()


@pytest.mark.parametrize("views_section, message", [
    ({"Five": {"classes": "all"}}, r"views.Five: expected a view name matching \[a-z0-9\]\[a-z0-9_-\]\{0,63\}"),
    ({"a" * 65: {"classes": "all"}}, "expected a view name matching"),
    ({"ok": {"classes": "all", "colour": 1}}, r"views.ok.colour: unknown key \(expected one of"),
    ({"ok": {"classes": "all", "where": [{"column": "width", "mni": 1}]}},
     r"views.ok.where.0.mni: unknown key \(did you mean min\?\)"),
    ({"ok": {"classes": "all", "where": [{"column": "width"}]}},
     r"views.ok.where.0: expected at least one of glob, min, max, in"),
    ({"ok": {"classes": "classes.txt"}}, r"views.ok.classes: expected all \| imagenet100 \| a file under curation/"),
    ({"ok": {"classes": "all", "splits": ["test"]}}, r"views.ok.splits.0: expected"),
])
def test_a_bad_spec_is_refused_by_the_params_model_naming_the_key(views_section, message):
    doc = repo_doc()
    doc["views"] = views_section
    with pytest.raises(PipelineError, match=message):
        validate_params(doc)


def test_a_class_list_file_and_near_duplicates_drop(sample, tmp_path):
    root, ids, spec = sample
    (root / "curation" / "views").mkdir(exist_ok=True)
    listed = "# the view's classes\n" + "".join(f"{c}  # comment\n" for c in spec["classes"]) + "\n"
    (root / "curation" / "views" / "five.txt").write_text(listed, encoding="utf-8")
    reports = root / "data" / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    want_labels, want_keep = expected(root, ids, spec, "val")
    rows = shard_rows(root / "data" / "parquet", "val")
    dropped = rows[int(np.flatnonzero(want_keep)[0])]
    (reports / "near_duplicates_exclude.csv").write_text(
        f"split,wnid,name,reason\nval,{dropped['wnid']},{dropped['path']},near-duplicate of train/x (distance 2)\n",
        encoding="utf-8")
    from_file = {**spec, "classes": "curation/views/five.txt", "near_duplicates": "drop"}
    out = tmp_path / "views"
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, {"five": from_file})), views_dir=out))
    meta, labels, keep = view_file(out / "five" / "val.parquet")
    assert np.array_equal(labels, want_labels)
    assert list(np.flatnonzero(want_keep != keep)) == [rows.index(dropped)]  # only the listed near-duplicate
    assert meta["steps"]["near_duplicates"] == int(want_keep.sum()) - 1
    (reports / "near_duplicates_exclude.csv").unlink()
    with pytest.raises(PipelineError, match=r"near_duplicates_exclude\.csv: expected the near-duplicate list"):
        views.job_from_params(setup(root, {"five": from_file}))


def test_a_format_2_base_overlay_gives_the_class_list(sample, tmp_path):
    """A base overlay carrying its own label map (an appended class): the view takes its classes from it."""
    root, ids, spec = sample
    base_dir, lmap = tmp_path / "overlay", read_label_map(root / "data" / "label_map.json")
    extra = {"label": 10, "wnid": "n99999999", "name": "late class", "words": "late class", "ilsvrc2012_id": 11}
    grown = {**lmap, "num_classes": 11, "classes": [*lmap["classes"], extra]}
    (tmp_path / "label_map.json").write_text(json.dumps(grown), encoding="utf-8")
    base_dir.mkdir()
    for split in ("train", "val"):
        meta, table = read_overlay(root / "data" / "overlay" / f"{split}.parquet")
        shards = [tuple(s) for s in meta["shards"]]
        labels, keep = table.column("label").to_numpy(), table.column("keep").to_numpy(zero_copy_only=False)
        grown_overlay = overlay_table(split, shards, labels, keep, {}, label_map=stored_label_map(grown))
        write_overlay(grown_overlay, base_dir / f"{split}.parquet")
    try:
        read_overlay(base_dir / "train.parquet")
    except OverlayError as err:
        pytest.skip(f"this branch's read_overlay refuses overlay format 2 (the reader's part adds it): {err}")
    job = views.job_from_params(setup(root, {"five": spec}))
    job = dataclasses.replace(job, overlay=base_dir, label_map=tmp_path / "label_map.json", views_dir=tmp_path / "v")
    views.write_views(job)
    meta, labels, keep = view_file(tmp_path / "v" / "five" / "train.parquet")
    assert np.array_equal(labels, expected(root, ids, spec, "train")[0])
    with pytest.raises(PipelineError, match="found 1 it lacks: 'n88888888'"):
        bad = views.job_from_params(setup(root, {"five": {**spec, "classes": ["n88888888"]}}))
        views.write_views(dataclasses.replace(bad, overlay=base_dir, label_map=tmp_path / "label_map.json",
                                              views_dir=tmp_path / "w"))
    late = views.job_from_params(setup(root, {"late": {"classes": ["n99999999"]}}))  # a class of no row yet
    with pytest.raises(PipelineError, match=r"views.late: expected rows of train in the view, found none"):
        views.write_views(dataclasses.replace(late, overlay=base_dir, label_map=tmp_path / "label_map.json",
                                              views_dir=tmp_path / "x"))


def test_the_repository_default_view_through_the_stage_command(sample, tmp_path, prefect_api):
    """`python -m flows.views` with the repository's params.yaml (its `views:` as committed) on the sample: the
    view files equal the functions' output, and dvc.yaml's views stage lists what its views read."""
    import subprocess
    import sys

    root, _, _ = sample
    doc = repo_doc()
    doc["paths"]["raw"] = "unused"
    doc["curate"] = CURATE
    (root / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    reports = root / "data" / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    first = shard_rows(root / "data" / "parquet", "val")[0]  # validate's list, as if it had found one
    (reports / "near_duplicates_exclude.csv").write_text(
        f"split,wnid,name,reason\nval,{first['wnid']},{first['path']},near-duplicate of train/x (distance 4)\n",
        encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "flows.views"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    written = tree(root / "data" / "views")
    listed = [f"{name}/{split}.parquet" for name, view in doc["views"].items() for split in view.get("splits", SPLITS)]
    assert sorted(written) == sorted([*listed, "views.json"])
    out = tmp_path / "views"
    views.write_views(dataclasses.replace(views.job_from_params(setup(root, doc["views"])), views_dir=out))
    assert tree(out) == written
    report = json.loads(written["views.json"])["views"]
    if "val-unseen" in report:  # the committed default: all of val but the listed near-duplicate
        assert report["val-unseen"]["splits"]["val"]["rows"] == len(shard_rows(root / "data" / "parquet", "val")) - 1
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["views"]
    assert stage["params"] == ["views"] and "${paths.views}" in stage["outs"]
    if any(v.get("near_duplicates") == "drop" for v in doc["views"].values()):
        assert f"${{paths.reports}}/{views.NEAR_DUPLICATES_CSV}" in stage["deps"]
    if any(isinstance(v["classes"], str) and "/" in v["classes"] for v in doc["views"].values()):
        assert "curation" in stage["deps"]


def test_shards_without_a_byte_index_other_class_names_and_a_label_name_condition(tmp_path):
    """Shards written by others (no footer byte index: the sizes are the image column's lengths), classes named
    `class 0`, ...: a view by curated label_name keeps exactly that class's rows."""
    from tasks.common.params import ViewSpec
    from tests.helpers.datasets import write_shards
    from tests.helpers.overlays import write_test_overlay

    parquet = tmp_path / "data" / "parquet"
    write_shards(parquet, "train", classes=3, total=12, shards=2)
    write_test_overlay(parquet)
    assert not any(IMAGE_INDEX_KEY.encode() in (pq.read_metadata(f).metadata or {}) for f in parquet.rglob("*.parquet"))
    lmap = read_label_map(parquet / "label_map.json")
    spec = ViewSpec.model_validate({"classes": "all", "splits": ["train"],
                                    "where": [{"column": "label_name", "in": ["class 1"]}]})
    job = views.ViewsJob(parquet, tmp_path / "data" / "overlay", parquet / "label_map.json", tmp_path / "views",
                         {"one": spec}, {"one": views.specs.ClassList(None, "test")}, None)
    report = views.write_views(job)
    meta, labels, keep = view_file(tmp_path / "views" / "one" / "train.parquet")
    stored = pq.read_table(parquet / "train", columns=["label", "image"])
    want = np.array(stored.column("label").to_pylist()) == 1
    assert np.array_equal(keep, want) and np.array_equal(labels, stored.column("label").to_numpy())
    assert meta["label_map"]["classes"] == lmap["classes"]  # classes: all keeps every class, in order
    images = stored.column("image").combine_chunks().field("bytes").to_pylist()
    kept_bytes = sum(len(b) for b, k in zip(images, want, strict=True) if k)
    assert report["one"]["splits"]["train"]["image_bytes"] == kept_bytes

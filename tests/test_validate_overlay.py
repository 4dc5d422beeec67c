"""validate over the merged view (issue 27, merge-on-read curation): the shards as converted are checked against
the manifests, the classes / counts / leakage / near-duplicates / decode sample against the shards with the curate
stage's overlay applied; an overlay made for other shards or altered fails naming it; the version index counts
curation moves while a curation-only change rewrites no shard."""
from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from imagenet_parquet.overlay import OVERLAY_KEY, write_overlay
from tasks.common import SPLITS, PipelineError
from tasks.common.layout import CURATION_REPORT
from tasks.validate import changes
from tasks.validate.near_dup import EXCLUDE_CSV, write_near_duplicate_outputs
from tasks.validate.report import REPORT_MD, write_reports
from tasks.validate.stage import raise_if_failed, run_validation
from tests.helpers.datasets import Dataset, make_dataset, set_bytes
from tests.helpers.overlays import write_test_overlay
from tests.helpers.params import validate_section

EXCLUDE = "split,wnid,name,reason\n"
RELABEL = "split,wnid,name,new_wnid,reason\n"
TENCH, GOLDFISH = "n01440764", "n01443537"  # labels 0 and 1 of make_dataset


def curate(ds: Dataset, exclude: str = "", relabel: str = "") -> dict[str, Any]:
    """The curate stage (tasks.curate) over the dataset's shards with these curation lines: its overlays and
    curation.json under `<root>/overlay`."""
    from tasks.curate.lines import read_curation
    from tasks.curate.stage import CurateJob, write_overlays
    (ds.root / "exclude.csv").write_text(EXCLUDE + exclude, encoding="utf-8")
    (ds.root / "relabel.csv").write_text(RELABEL + relabel, encoding="utf-8")
    lines = read_curation(ds.root / "exclude.csv", ds.root / "relabel.csv",
                          {"exclude": "curation/exclude.csv", "relabel": "curation/relabel.csv"})
    return write_overlays(CurateJob(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, ds.root / "overlay", lines))


def _run(ds: Dataset, **params: Any) -> dict[str, Any]:
    return run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section(**params),
                          ds.root / "overlay")


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def _counts(report: dict[str, Any], split: str) -> dict[str, int]:
    return {row["wnid"]: row[split] for row in report["classes"]}


def _leaky(ds: Dataset) -> str:
    """val image 2 (class tench) holds the bytes of train tench 1: a leak (and a near-duplicate at distance 0)."""
    train, val = ds.rows["train"][0], ds.rows["val"][1]
    set_bytes(val, train["image"]["bytes"])
    val.update(width=train["width"], height=train["height"], phash=train["phash"])
    return val["image"]["path"]


def test_relabelled_rows_count_in_their_new_class_while_the_shards_match_the_manifests(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    curate(ds, relabel=f"train,{TENCH},{TENCH}_1.JPEG,{GOLDFISH},wrong label\n")
    report = _run(ds)
    assert report["status"] == "pass", [c["message"] for c in report["checks"] if c["status"] != "pass"]
    assert _counts(report, "train") == {TENCH: 3, GOLDFISH: 5, "n01484850": 4}
    checks = _checks(report)
    assert checks["labels_match_manifest"]["message"] == "18 rows agree with the manifests"  # as converted
    assert "train: 1 relabelled, 0 excluded" in checks["overlay_matches_shards"]["message"]
    assert report["splits"]["train"] == {**report["splits"]["train"], "rows": 12, "relabelled": 1, "images": 12}
    write_reports(report, ds.reports_dir, ds.metrics_path)
    markdown = (ds.reports_dir / REPORT_MD).read_text()
    assert "## Curation applied" in markdown and f"| relabel | train | wrong label | 1 | {TENCH}->{GOLDFISH} (1) |" \
        in markdown and "Files: exclude: `curation/exclude.csv`, relabel: `curation/relabel.csv`." in markdown


def test_an_excluded_image_no_longer_leaks_nor_pairs_and_is_not_decoded(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    leaked = _leaky(ds)
    ds.write()
    write_test_overlay(ds.parquet_dir)
    before = _run(ds)
    assert {"leakage", "near_duplicates"} <= {n for n, c in _checks(before).items() if c["status"] != "pass"}
    written = write_near_duplicate_outputs(before, ds.parquet_dir, ds.reports_dir)
    assert written[1].name == EXCLUDE_CSV and leaked in written[1].read_text()
    # the user's loop: the candidate list copied unchanged to the curation exclude list, curate, validate
    curate(ds, exclude=written[1].read_text().split("\n", 1)[1])
    after = _run(ds)
    checks = _checks(after)
    assert after["status"] == "pass", [c["message"] for c in after["checks"] if c["status"] != "pass"]
    assert checks["leakage"]["message"] == "no image is in both train and val"
    assert after["near_duplicates"]["pairs"] == [] and after["near_duplicates"]["chance"]["comparisons"] == 12 * 5
    assert checks["manifest_totals"]["status"] == "pass" and checks["sha256_match"]["message"] == "all hashes match ok"
    assert after["splits"]["val"] == {**after["splits"]["val"], "rows": 6, "excluded": 1, "images": 5, "decoded": 5}
    assert _counts(after, "val")[TENCH] == 1
    again = write_near_duplicate_outputs(after, ds.parquet_dir, tmp_path / "again")
    assert again[1].read_text() == EXCLUDE  # nothing left to exclude
    raise_if_failed(after, ds.reports_dir)


def test_an_excluded_train_image_is_not_searched_for_near_duplicates(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    _leaky(ds)
    ds.write()
    write_test_overlay(ds.parquet_dir, exclude={("train", f"{TENCH}_1.JPEG")})
    report = _run(ds)
    assert report["near_duplicates"]["pairs"] == [] and _checks(report)["leakage"]["status"] == "pass"
    assert report["near_duplicates"]["chance"]["comparisons"] == 11 * 6


def test_class_count_bounds_apply_to_the_merged_view(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    write_test_overlay(ds.parquet_dir)
    assert _checks(_run(ds, train_count=[3, 4]))["class_counts"]["status"] == "pass"
    write_test_overlay(ds.parquet_dir, exclude={("train", f"{TENCH}_1.JPEG"), ("train", f"{TENCH}_2.JPEG")},
                       labels={("train", f"{GOLDFISH}_1.JPEG"): 2})
    check = _checks(_run(ds, train_count=[3, 4]))["class_counts"]
    assert check["status"] == "fail" and check["failures"] == 2, check["message"]
    assert f"train label 0 {TENCH} 'tench' has 2 images, expected 3..4" in check["message"]
    assert [(e["wnid"], e["count"]) for e in check["examples"]] == [(TENCH, 2), ("n01484850", 5)]


def test_a_class_emptied_in_val_by_the_overlay_fails_the_class_set(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    val = {("val", r["image"]["path"]) for r in ds.rows["val"] if r["label"] == 2}
    write_test_overlay(ds.parquet_dir, exclude=val)
    check = _checks(_run(ds))["class_set"]
    assert check["status"] == "fail" and "label 2 n01484850 'great white shark' has no val images" in check["message"]


def test_an_overlay_made_for_other_shards_fails_naming_the_overlay(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    overlay = write_test_overlay(ds.parquet_dir)
    row = ds.rows["train"][7]
    set_bytes(row, row["image"]["bytes"] + b"\x00")  # convert ran again: another train shard, the same val
    ds.overlay = False  # ... and curate did not
    ds.write()
    report = _run(ds)
    check = _checks(report)["overlay_matches_shards"]
    assert check["status"] == "fail" and check["failures"] == 1 and report["status"] == "fail"
    assert check["message"].startswith(f"1 split(s) whose overlay does not belong to the shards — train: "
                                       f"{overlay / 'train.parquet'}: expected shard train-00001-of-00002.parquet")
    assert "the shard changed, or its footer was altered" in check["message"]
    assert check["examples"] == [{**check["examples"][0], "split": "train", "overlay": str(overlay / "train.parquet")}]
    assert _checks(report)["sha256_match"]["status"] == "pass"  # the shard checks still ran
    with pytest.raises(PipelineError, match=r"overlay_matches_shards: .*train\.parquet"):
        raise_if_failed(report, ds.reports_dir)


def test_an_altered_overlay_or_one_listing_missing_shards_fails(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    overlay = write_test_overlay(ds.parquet_dir)
    table = pq.read_table(overlay / "val.parquet")
    meta = json.loads(table.schema.metadata[OVERLAY_KEY])
    meta["shards"][0][2] = "0" * 64  # a footer digest edited by hand
    write_overlay(table.replace_schema_metadata({OVERLAY_KEY: json.dumps(meta)}), overlay / "val.parquet")
    check = _checks(_run(ds))["overlay_matches_shards"]
    assert check["status"] == "fail" and "val: " in check["message"] and "(altered)" in check["message"]
    write_test_overlay(ds.parquet_dir)
    (ds.parquet_dir / "train" / "train-00001-of-00002.parquet").unlink()  # a shard the overlay lists is gone
    check = _checks(_run(ds))["overlay_matches_shards"]
    assert check["status"] == "fail" and "listing shards that are not there: ['train-00001-of-00002.parquet']" \
        in check["message"]


def test_no_overlay_or_no_curation_report_names_the_file_and_the_stage(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    ds.overlay = False
    ds.write()
    with pytest.raises(PipelineError, match=r"overlay/train\.parquet: expected the train curation overlay .* "
                                            r"found no file; run `dvc repro curate`"):
        _run(ds)
    overlay = write_test_overlay(ds.parquet_dir)
    (overlay / CURATION_REPORT).unlink()
    with pytest.raises(PipelineError, match=r"curation\.json: expected .* found no file; run `dvc repro curate`"):
        _run(ds)
    # the default overlay_dir: beside the shards, where readers find it
    write_test_overlay(ds.parquet_dir)
    assert run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section())["status"] == "pass"


def test_a_curation_only_change_rewrites_no_shard_and_counts_the_moves(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    versions = tmp_path / "versions"
    curate(ds)
    assert changes.record_version(versions, _run(ds)["version"]) == {"previous": False}
    shards = {p: p.read_bytes() for p in sorted(ds.parquet_dir.rglob("*.parquet"))}
    curate(ds, exclude=f"val,{TENCH},ILSVRC2012_val_00000001.JPEG,blurry\n",
           relabel=f"train,{TENCH},{TENCH}_1.JPEG,{GOLDFISH},wrong label\n")
    assert {p: p.read_bytes() for p in shards} == shards  # curate rewrites no shard
    found = changes.record_version(versions, _run(ds)["version"])
    metrics = json.loads((versions / changes.CHANGES_FILE).read_text())
    assert metrics["train"] == {"images_added": 0, "images_removed": 0, "images_relabelled": 1, "classes_changed": 2,
                                "shards_rewritten": 0, "shards_removed": 0, "shards": 2}
    assert metrics["val"] == {"images_added": 0, "images_removed": 1, "images_relabelled": 0, "classes_changed": 1,
                              "shards_rewritten": 0, "shards_removed": 0, "shards": 1}
    assert found["train"]["classes"] == [
        {"wnid": TENCH, "before": 4, "after": 3, "added": 0, "removed": 0, "relabelled_in": 0, "relabelled_out": 1},
        {"wnid": GOLDFISH, "before": 4, "after": 5, "added": 0, "removed": 0, "relabelled_in": 1,
         "relabelled_out": 0}]
    curate(ds)  # both lines undone: the image comes back, the relabelled one moves back
    changes.record_version(versions, _run(ds)["version"])
    undone = json.loads((versions / changes.CHANGES_FILE).read_text())
    assert undone["val"]["images_added"] == 1 and undone["val"]["images_removed"] == 0
    assert undone["train"]["images_relabelled"] == 1 and undone["train"]["shards_rewritten"] == 0
    assert all(v >= 0 for split in SPLITS for v in undone[split].values())


def test_lines_naming_quarantined_images_are_reported_and_change_no_count(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    lost = ds.rows["val"].pop(3)["image"]["path"]
    ds.bad.append({"split": "val", "source": "data/raw/ILSVRC2012_img_val.tar", "member": lost, "name": lost,
                   "reason": "cannot identify image file"})
    ds.write()
    curate(ds)
    versions = tmp_path / "versions"
    changes.record_version(versions, _run(ds)["version"])
    wnid = next(m["wnid"] for m in ds.manifests["val"] if m["name"] == lost)
    curate(ds, exclude=f"val,{wnid},{lost},blurry\n")
    report = _run(ds)
    assert report["status"] == "pass" and report["version"]["curated"] == []
    assert report["curation"]["not_in_shards"][0]["name"] == lost
    assert changes.changes_metrics(changes.record_version(versions, report["version"]))["val"]["classes_changed"] == 0
    write_reports(report, ds.reports_dir, ds.metrics_path)
    assert f"1 line(s) name image(s) convert quarantined (bad_images.jsonl): nothing to apply — `val/{wnid}/{lost}`" \
        in (ds.reports_dir / REPORT_MD).read_text()


def test_the_contact_sheet_shows_the_merged_view(tmp_path):
    from tasks.validate.contact_sheet import overlaid, select_rows, write_contact_sheet
    from tasks.validate.scan import list_shards
    ds = make_dataset(tmp_path / "ds").write()
    overlay = write_test_overlay(ds.parquet_dir, exclude={("train", f"{TENCH}_1.JPEG")},
                                 labels={("train", f"{GOLDFISH}_1.JPEG"): 0})
    picks = select_rows(list_shards(ds.parquet_dir), [0, 1], 4, {s: overlaid(overlay, s) for s in SPLITS})

    def names(rows):
        return [pq.ParquetFile(path).read(columns=["image.path"]).column("image").combine_chunks().field("path")
                [row].as_py() for path, row in rows]
    assert sorted(names(picks["train", 0])) == [*(f"{TENCH}_{i}.JPEG" for i in (2, 3, 4)), f"{GOLDFISH}_1.JPEG"]
    assert f"{GOLDFISH}_1.JPEG" not in names(picks["train", 1]) and len(picks["train", 1]) == 3
    assert overlaid(tmp_path / "nowhere", "train") == {}  # no overlay: the shards as converted
    assert write_contact_sheet(ds.parquet_dir, ds.label_map_path, tmp_path / "s.png", 2, 20, overlay).is_file()

"""The validate stage: each check fails on a purpose-built broken dataset with the right message; a valid
dataset passes; the reports are complete and deterministic."""
from __future__ import annotations

import csv
import io
import json
from typing import Any

import pyarrow as pa
import pytest
from PIL import Image

from imagenet_parquet.format import shard_schema
from tasks.common import PipelineError
from tasks.validate.contact_sheet import shown_labels, write_contact_sheet
from tasks.validate.report import REPORT_JSON, REPORT_MD, write_reports
from tasks.validate.stage import raise_if_failed, run_validation
from tests.helpers.datasets import Dataset, make_dataset, set_bytes, write_shards
from tests.helpers.images import jpeg
from tests.helpers.params import validate_section
from tests.test_validate_overlay import write_test_overlay


def _run(ds: Dataset, overlay: bool = True, **params: Any) -> dict[str, Any]:
    """Validate the dataset with an overlay that changes nothing, made for its shards as they are (`overlay`
    False: the one already written)."""
    if overlay:
        write_test_overlay(ds.parquet_dir, ds.root / "overlay")
    return run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section(**params),
                          ds.root / "overlay")


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def _failed(report: dict[str, Any]) -> set[str]:
    return {c["name"] for c in report["checks"] if c["status"] == "fail"}


def test_valid_dataset_passes_and_reports_are_complete(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    report = _run(ds)
    assert report["status"] == "pass", [c["message"] for c in report["checks"] if c["status"] != "pass"]
    assert report["splits"]["train"]["rows"] == 12 and report["splits"]["val"]["rows"] == 6
    assert report["splits"]["train"]["shards"] == 2 and report["splits"]["val"]["decoded"] == 6
    assert report["class_counts"]["val"] == {"min": 2, "median": 2.0, "max": 2, "bounds": [1, 50],
                                             "out_of_bounds": []}
    raise_if_failed(report, ds.reports_dir)  # passes silently
    write_reports(report, ds.reports_dir, ds.metrics_path)
    markdown = (ds.reports_dir / REPORT_MD).read_text()
    for text in ("PASSED", "## Counts per split", "## Images per class", "## Checks", "## Schema",
                 "`sha256` | `string`", "[contact_sheet.png](contact_sheet.png)", "## Bad images"):
        assert text in markdown
    metrics = json.loads(ds.metrics_path.read_text())
    assert metrics["train"]["rows"] == 12 and metrics["val"]["class_min"] == 2 and metrics["checks"]["fail"] == 0
    rows = list(csv.DictReader(io.StringIO((ds.reports_dir / "class_counts.csv").read_text())))
    assert len(rows) == 6 and rows[0] == {"split": "train", "label": "0", "wnid": "n01440764", "name": "tench",
                                          "count": "4"}


def test_reports_and_contact_sheet_are_deterministic(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    outputs = []
    for attempt in range(2):
        out = tmp_path / f"reports{attempt}"
        write_reports(_run(ds), out, out / "validate.json")
        write_contact_sheet(ds.parquet_dir, ds.label_map_path, out / "contact_sheet.png", 2, 20)
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    with Image.open(io.BytesIO(outputs[0]["contact_sheet.png"])) as sheet:
        assert sheet.format == "PNG" and sheet.height > 3 * 72  # one row per class


def test_contact_sheet_shows_each_class_train_and_val(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    solid = {0: (255, 0, 0), 1: (0, 0, 255), 2: (0, 255, 0)}
    for split in ("train", "val"):
        for row in ds.rows[split]:
            set_bytes(row, jpeg(solid[row["label"]], size=(40, 40), quality=95) + row["image"]["path"].encode())
            # (unique bytes after EOI)
    ds.write()
    with Image.open(write_contact_sheet(ds.parquet_dir, ds.label_map_path, tmp_path / "s.png", 2, 20)) as sheet:
        rgb = sheet.convert("RGB")
        for label, colour in solid.items():  # centre of the first train and of the first val thumbnail
            y = 24 + label * 76 + 36
            for x in (8 + 260 + 36, 8 + 260 + 2 * 76 + 16 + 36):
                assert all(abs(a - b) < 40 for a, b in zip(rgb.getpixel((x, y)), colour)), (label, x)
    assert shown_labels(1000, 5) == [0, 250, 500, 749, 999] and shown_labels(3, 20) == [0, 1, 2]


def _wrong_label_out_of_range(ds: Dataset) -> None:
    ds.rows["val"][0]["label"] = 99


def _shifted_label(ds: Dataset) -> None:  # a val image of class 0 (wnid n01440764) stored with label 1
    ds.rows["val"][0]["label"] = 1


def _wnid_name_mismatch(ds: Dataset) -> None:
    ds.rows["train"][5]["label_name"] = "tench"


def _class_missing_from_val(ds: Dataset) -> None:
    ds.drop("val", 2)


def _same_image_in_train_and_val(ds: Dataset) -> None:
    set_bytes(ds.rows["val"][1], ds.rows["train"][0]["image"]["bytes"])
    ds.rows["val"][1].update(width=ds.rows["train"][0]["width"], height=ds.rows["train"][0]["height"])


def _png_bytes(ds: Dataset) -> None:
    set_bytes(ds.rows["train"][3], jpeg("red", size=(24, 16), fmt="PNG"))


def _hash_mismatch(ds: Dataset) -> None:
    row = ds.rows["train"][7]
    set_bytes(row, row["image"]["bytes"] + b"\x00", rehash=False)  # one byte after EOI: still decodes


def _truncated_jpeg(ds: Dataset) -> None:
    row = ds.rows["val"][4]
    set_bytes(row, row["image"]["bytes"][:200])


def _image_lost_in_conversion(ds: Dataset) -> None:
    ds.rows["train"].pop(2)


def _duplicate_path(ds: Dataset) -> None:
    ds.rows["train"][1]["image"] = {"bytes": ds.rows["train"][1]["image"]["bytes"],
                                    "path": ds.rows["train"][0]["image"]["path"]}


def _null_name(ds: Dataset) -> None:
    ds.rows["val"][2]["label_name"] = None


def _zero_width(ds: Dataset) -> None:
    ds.rows["train"][0]["width"] = 0


def _val_with_other_label_map(ds: Dataset) -> None:
    other = json.loads(json.dumps(ds.label_map))
    other["classes"][1]["name"] = "carp"
    ds.shard_label_maps["val"] = other


def _width_as_int64(ds: Dataset) -> None:
    base = shard_schema(ds.label_map, {"policy": "passthrough"}, "train")
    width = base.get_field_index("width")
    ds.schema_overrides["train"] = base.set(width, pa.field("width", pa.int64())).with_metadata(base.metadata)


BROKEN = {  # id: (break the dataset, params, failing check, words of its message)
    "wrong_label": (_wrong_label_out_of_range, {}, "label_in_range", "label = 99"),
    "shifted_label": (_shifted_label, {}, "wnid_matches_label",
                      "wnid 'n01440764', but label_map.json has wnid 'n01443537' for label 1"),
    "shifted_label_vs_manifest": (_shifted_label, {}, "labels_match_manifest", "label 1, the manifest says 0"),
    "wnid_name_mismatch": (_wnid_name_mismatch, {}, "name_matches_label",
                           "label_name 'tench', but label_map.json has name 'goldfish' for label 1"),
    "class_missing_from_val": (_class_missing_from_val, {}, "class_set",
                               "label 2 n01484850 'great white shark' has no val images (train has 4)"),
    "same_image_in_train_and_val": (_same_image_in_train_and_val, {}, "leakage",
                                    "train 'n01440764_1.JPEG' = val 'ILSVRC2012_val_00000002.JPEG'"),
    "non_jpeg_bytes": (_png_bytes, {}, "jpeg_soi", "'n01440764_4.JPEG': starts with 89 50 4e 47"),
    "count_out_of_bounds": (lambda ds: None, {"train_count": [5, 10]}, "class_counts",
                            "train label 0 n01440764 'tench' has 4 images, expected 5..10"),
    "hash_mismatch": (_hash_mismatch, {}, "sha256_match", "'n01443537_4.JPEG': sha256 of the bytes is"),
    "truncated_jpeg": (_truncated_jpeg, {}, "decode", "Pillow cannot decode it"),
    "image_lost": (_image_lost_in_conversion, {}, "manifest_totals",
                   "train: 11 rows, expected 12 = 12 manifest rows - 0 quarantined; missing ['n01440764_3.JPEG']"),
    "duplicate_path": (_duplicate_path, {}, "unique_image_paths", "image_path = 'n01440764_1.JPEG'"),
    "null_name": (_null_name, {}, "not_null", "label_name = None"),
    "zero_width": (_zero_width, {}, "positive_size", "width = 0"),
    "val_other_label_map": (_val_with_other_label_map, {}, "schema_metadata",
                            "val/val-00000-of-00001.parquet: imagenet_parquet.label_map differs"),
    "width_as_int64": (_width_as_int64, {}, "shard_schema", "missing/mistyped ['width: int32']"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_check_fails_on_its_broken_dataset(tmp_path, case):
    breaker, params, check, words = BROKEN[case]
    ds = make_dataset(tmp_path / "ds")
    breaker(ds)
    report = _run(ds.write(), **params)
    result = _checks(report)[check]
    assert result["status"] == "fail" and words in result["message"], result["message"]
    assert result["examples"] and report["status"] == "fail"
    with pytest.raises(PipelineError, match=rf"(?s)validation failed: .*\n  - {check}: "):
        raise_if_failed(report, ds.reports_dir)
    write_reports(report, ds.reports_dir, ds.metrics_path)  # a failed run still writes its reports
    markdown = (ds.reports_dir / REPORT_MD).read_text()
    assert "FAILED" in markdown and f"### `{check}`: FAIL" in markdown
    assert json.loads((ds.reports_dir / REPORT_JSON).read_text())["status"] == "fail"


def test_broken_checks_do_not_spill_onto_unrelated_checks(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    _hash_mismatch(ds)
    assert _failed(_run(ds.write())) == {"sha256_match"}
    ds = make_dataset(tmp_path / "ds2")
    _class_missing_from_val(ds)
    assert _failed(_run(ds.write())) == {"class_set", "class_counts"}


def test_leakage_below_the_threshold_is_a_warning(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    _same_image_in_train_and_val(ds)
    report = _run(ds.write(), leakage_max_pairs=1)
    leakage = _checks(report)["leakage"]
    assert report["status"] == "warn" and leakage["status"] == "warn" and leakage["failures"] == 1
    assert leakage["examples"][0]["image_path_train"] == "n01440764_1.JPEG"
    raise_if_failed(report, ds.reports_dir)  # warnings do not fail the stage


def test_quarantined_images_are_subtracted_and_listed(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    lost = ds.rows["val"].pop(3)["image"]["path"]
    ds.bad.append({"split": "val", "source": "data/raw/ILSVRC2012_img_val.tar", "member": lost, "name": lost,
                   "reason": "cannot identify image file"})
    report = _run(ds.write())
    assert report["status"] == "pass" and report["bad_images"]["count"] == 1
    assert report["splits"]["val"] == {**report["splits"]["val"], "rows": 5, "manifest_rows": 6, "quarantined": 1}
    write_reports(report, ds.reports_dir, ds.metrics_path)
    assert "| cannot identify image file | 1 |" in (ds.reports_dir / REPORT_MD).read_text()


def test_decode_sample_is_deterministic_and_bounded(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    assert _run(ds, decode_sample=3)["splits"]["train"]["decoded"] == 3
    assert _run(ds, decode_sample=0.5)["splits"]["val"]["decoded"] == 3
    assert _run(ds, decode_sample=0)["splits"]["val"]["decoded"] == 0
    with pytest.raises(PipelineError, match="validate.decode_sample"):
        _run(ds, decode_sample="some")
    with pytest.raises(PipelineError, match=r"validate.val_count: expected \[min, max\]"):
        _run(ds, val_count=[5, 1])


def test_missing_inputs_name_the_file_and_the_stage_to_run(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    write_test_overlay(ds.parquet_dir, ds.root / "overlay")
    shard = ds.parquet_dir / "val" / "val-00000-of-00001.parquet"
    shard.write_bytes(b"not parquet")
    with pytest.raises(PipelineError, match="val-00000-of-00001.parquet: expected a Parquet shard"):
        _run(ds, overlay=False)
    ds.write()
    (ds.parquet_dir / "bad_images.jsonl").unlink()
    with pytest.raises(PipelineError, match="bad_images.jsonl: expected .* run `dvc repro convert`"):
        _run(ds, overlay=False)
    (ds.manifests_dir / "val.parquet").unlink()
    with pytest.raises(PipelineError, match="val.parquet: expected the val manifest"):
        _run(ds, overlay=False)
    (ds.root / "overlay" / "val.parquet").unlink()
    with pytest.raises(PipelineError, match="val.parquet: expected the val curation overlay .* `dvc repro curate`"):
        _run(ds, overlay=False)



def test_contact_sheet_reads_shards_only_until_every_pick_is_filled(tmp_path):
    """19,000 classes in ~5,000 hashed-order shards: the sheet's few classes fill from the first shards, the rest
    are never opened (a missing file past that point is not read)."""
    from tasks.validate.contact_sheet import select_rows

    files = write_shards(tmp_path / "train", total=12, classes=2, shards=1)
    val = write_shards(tmp_path / "val", split="val", total=12, classes=2, shards=1)
    never = tmp_path / "train" / "train-zz-not-there.parquet"
    picks = select_rows({"train": [*files, never], "val": [*val, never]}, [0, 1], 2)
    assert picks == {(s, label): [(f[0], 6 * label), (f[0], 6 * label + 1)]
                     for s, f in (("train", files), ("val", val)) for label in (0, 1)}
    with pytest.raises(FileNotFoundError):
        select_rows({"train": [*files, never], "val": val}, [0, 1], 7)  # 6 per class there: looks further

"""validate's `class_set` with a val split held out of train (params extract.holdout): a small class may hold out
no val image (a warning with the count and the fraction), a class missing from train still fails."""
from __future__ import annotations

import json
from typing import Any

from tasks.common.layout import EXTRACT_REPORT
from tasks.validate.stage import run_validation
from tests.helpers.datasets import Dataset, make_dataset
from tests.helpers.params import validate_section
from tests.test_validate_overlay import write_test_overlay

HOLDOUT = {"fraction": 0.02, "seed": 0, "images": {"train": 12, "val": 4}}
BOUNDS = {"val_count": [0, 50]}  # class_counts: a class with no val image is within the bounds


def _class_set(ds: Dataset, holdout: dict[str, Any] | None) -> dict[str, Any]:
    ds.write()
    if holdout is not None:  # what the extract stage writes when extract.holdout is set
        report = {"mode": "folder", "holdout": holdout}
        (ds.manifests_dir / EXTRACT_REPORT).write_text(json.dumps(report), encoding="utf-8")
    overlay = write_test_overlay(ds.parquet_dir, ds.root / "overlay")
    report = run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section(**BOUNDS), overlay)
    return next(c for c in report["checks"] if c["name"] == "class_set")


def test_with_a_holdout_a_class_without_val_images_warns_with_the_count_and_the_fraction(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    ds.drop("val", 2)
    check = _class_set(ds, HOLDOUT)
    assert check["status"] == "warn" and check["failures"] == 1, check["message"]
    assert check["message"].startswith(
        "1 class(es) have no held-out val image: holdout fraction 0.02 (params.yaml extract.holdout); expected at "
        "small classes — e.g. label 2 n01484850 'great white shark' (train has 4)")
    assert [e["wnid"] for e in check["examples"]] == ["n01484850"]


def test_without_a_holdout_a_class_without_val_images_still_fails(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    ds.drop("val", 2)
    check = _class_set(ds, None)
    assert check["status"] == "fail" and "has no val images (train has 4)" in check["message"]


def test_with_a_holdout_a_class_without_train_images_still_fails(tmp_path):
    ds = make_dataset(tmp_path / "ds")
    ds.drop("train", 1)
    ds.drop("val", 2)
    check = _class_set(ds, HOLDOUT)
    assert check["status"] == "fail" and check["failures"] == 1
    assert "label 1 n01443537 'goldfish' has no train images (val has 2)" in check["message"]


def test_with_a_holdout_every_class_in_both_splits_passes(tmp_path):
    check = _class_set(make_dataset(tmp_path / "ds"), HOLDOUT)
    assert check["status"] == "pass"

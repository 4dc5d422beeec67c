"""The same file name in every class folder (`0001.jpg` in each, a common layout; issue 28 item 7): an image is
known by its class and name — validate's checks, the holdout and the row order key on both, and ImageNet (whose
names are unique) keeps its order byte for byte."""
from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tasks.common.params import HoldoutParams
from tasks.convert.distribute import run_local
from tasks.convert.job import job_from_params
from tasks.convert.plan import ORDER_KEY, order_rows
from tasks.extract import stage as extract
from tasks.extract.holdout import holdout_value, split_holdout
from tasks.curate import stage as curate
from tasks.validate.stage import run_validation
from tests.helpers.datasets import make_dataset, small_jpeg
from tests.helpers.params import project, validate_section

BOUNDS = {"train_count": [1, 100], "val_count": [1, 100]}


def _checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def _tree(root: Path, classes: int, per_class: dict[str, int], nested: bool = False) -> None:
    seed = 0
    for split, count in per_class.items():
        for c in range(classes):
            for i in range(count):
                seed += 1
                path = root / split / f"class {c:02d}" / (f"sub{i % 2}/" if nested else "") / f"{i // (2 if nested else 1) + 1:04d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(small_jpeg(seed))


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_a_folder_tree_with_one_name_in_every_class_converts_and_passes_validate(tmp_path, nested):
    """`0001.jpg` .. in every class (nested: `sub0/0001.jpg`, `sub1/0001.jpg` in one class too), end to end."""
    tree, root = tmp_path / "tree", tmp_path / "project"
    _tree(tree, 5, {"train": 6, "val": 2}, nested)
    setup = project(root)
    where = setup.paths
    for split in extract.SPLITS:
        extract.scan_folder_split_to(split, tree, where["work"] / "extract", root=root)
    extract.finalize(where["work"] / "extract", where["manifests"], where["label_map"], mode="folder")
    run_local(job_from_params(setup.params.convert, where, root=root), progress=False)
    curate.write_overlays(curate.job_from_params(setup))
    report = run_validation(where["parquet"], where["manifests"], where["label_map"], validate_section(**BOUNDS))
    failed = {name: c["message"] for name, c in _checks(report).items() if c["status"] == "fail"}
    assert failed == {}


def _same_names(tmp_path: Path):
    """A validate dataset whose images are named 0001.JPEG, 0002.JPEG, ... in every class."""
    ds = make_dataset(tmp_path / "ds", classes=4, train_per_class=3, val_per_class=2)
    for split in ("train", "val"):
        number: dict[int, int] = {}
        for row, manifest in zip(ds.rows[split], ds.manifests[split], strict=True):
            number[row["label"]] = number.get(row["label"], 0) + 1
            row["image"]["path"] = manifest["name"] = f"{number[row['label']]:04d}.JPEG"
    return ds


def _validate(ds) -> dict[str, dict]:
    ds.write()
    return _checks(run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section(**BOUNDS)))


def test_one_name_in_every_class_passes_the_identity_checks(tmp_path):
    checks = _validate(_same_names(tmp_path))
    for name in ("unique_image_paths", "manifest_totals", "labels_match_manifest"):
        assert checks[name]["status"] == "pass", checks[name]["message"]


def test_with_one_name_in_every_class_a_relabelled_row_still_fails(tmp_path):
    ds = _same_names(tmp_path)
    ds.rows["train"][0]["label"] = 2  # class 0's 0001.JPEG now says class 2 (which has a 0001.JPEG of its own)
    ds.rows["train"][0]["wnid"], ds.rows["train"][0]["label_name"] = (
        ds.label_map["classes"][2]["wnid"], ds.label_map["classes"][2]["name"])
    checks = _validate(ds)
    assert checks["labels_match_manifest"]["status"] == "fail"
    assert "'0001.JPEG': label 2, the manifest says 0" in checks["labels_match_manifest"]["message"]
    assert checks["unique_image_paths"]["status"] == "fail"  # class 2 now holds two rows named 0001.JPEG
    assert checks["manifest_totals"]["status"] == "pass"  # the same images by name: which class is the check above


def test_with_one_name_in_every_class_a_repeated_image_fails_uniqueness(tmp_path):
    ds = _same_names(tmp_path)
    ds.rows["train"].append(copy.deepcopy(ds.rows["train"][0]))
    checks = _validate(ds)
    assert checks["unique_image_paths"]["status"] == "fail"
    assert checks["manifest_totals"]["status"] == "fail"


def test_with_one_name_in_every_class_quarantine_and_loss_are_told_apart(tmp_path):
    ds = _same_names(tmp_path)
    lost = ds.rows["train"].pop(3)  # class 1's 0001.JPEG
    ds.bad = [{"split": "train", "source": "x", "member": "", "name": lost["image"]["path"], "reason": "truncated"}]
    assert _validate(ds)["manifest_totals"]["status"] == "pass"
    ds.rows["train"].pop(3)  # and class 1's 0002.JPEG, not quarantined
    checks = _validate(ds)
    assert checks["manifest_totals"]["status"] == "fail" and "0002.JPEG" in checks["manifest_totals"]["message"]


def test_the_holdout_hashes_class_and_name_in_folder_mode(tmp_path):
    names = [f"{i:04d}.jpg" for i in range(1, 21)]
    table = pa.table({"wnid": [f"class {c}" for c in range(30) for _ in names], "name": names * 30})
    _, val, _ = split_holdout(table, HoldoutParams(fraction=0.2, seed=0), by_class=True)
    held = {}
    for row in val.to_pylist():
        held.setdefault(row["wnid"], set()).add(row["name"])
    assert len({frozenset(v) for v in held.values()}) > 10  # not the same names held out of every class
    assert 0.1 < val.num_rows / table.num_rows < 0.3
    key = b"imagenet-parquet/holdout/v2/0"
    expected = hashlib.blake2b("class 3/0007.jpg".encode(), digest_size=8, key=key).digest()
    assert holdout_value("0007.jpg", 0, "class 3") == int.from_bytes(expected, "big")  # docs/CONTRACTS.md
    legacy = hashlib.blake2b(b"n01440764_1.JPEG", digest_size=8, key=b"imagenet-parquet/holdout/v1/0").digest()
    assert holdout_value("n01440764_1.JPEG", 0) == int.from_bytes(legacy, "big")  # archive21k: unchanged


def _manifest(wnids: list[str], names: list[str]) -> pa.Table:
    rows = sorted((w, n) for w in wnids for n in names)
    return pa.table({"wnid": [w for w, _ in rows], "name": [n for _, n in rows], "size": [1] * len(rows)})


def test_hashed_order_mixes_the_classes_of_equal_names_and_keeps_unique_names_order():
    unique = pa.table({"wnid": ["a"] * 50 + ["b"] * 50, "name": [f"n{i}.JPEG" for i in range(100)],
                       "size": [1] * 100})
    by_name = sorted(range(100), key=lambda i: hashlib.blake2b(f"n{i}.JPEG".encode(), digest_size=16,
                                                                key=ORDER_KEY).digest())
    assert order_rows(unique, "hashed").column("name").to_pylist() == [f"n{i}.JPEG" for i in by_name]
    wnids = [f"class {c:03d}" for c in range(200)]
    ordered = order_rows(_manifest(wnids, [f"{i:04d}.jpg" for i in range(1, 21)]), "hashed")
    assert ordered.equals(order_rows(_manifest(wnids, [f"{i:04d}.jpg" for i in range(1, 21)]), "hashed"))
    first = ordered.slice(0, 200)
    assert len(set(first.column("name").to_pylist())) == 1  # one name's rows stay together ...
    classes = first.column("wnid").to_pylist()
    assert classes != sorted(classes)  # ... in a keyed order of their classes, not class order
    labels = [wnids.index(w) for w in classes[:100]]
    assert max(labels) - min(labels) > 150 and len(set(labels)) == 100
    assert pc.count_distinct(ordered.column("wnid")).as_py() == 200

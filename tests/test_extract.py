"""Extract stage: nested-tar index, val labels (devkit vs CSV), subsets, folder mode, ImageFolder tree."""
from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.common import ARCHIVES, DATA_DIR, PipelineError
from tasks.common.class_lists import read_class_list
from tasks.common.manifests import MANIFEST_SCHEMA
from tasks.common.synsets import shipped_synsets
from tasks.extract import classes as labels
from tasks.extract import stage as extract
from tasks.extract.devkit import read_label_csv
from tests.helpers.archives import devkit_bytes, manifest, run_extract, small_release, tar_bytes, write_release
from tests.helpers.params import project


def tarfile_bytes(archive: Path, member: str) -> bytes:
    """What tarfile itself extracts for `member` (`inner.tar/name` for nested tars)."""
    with tarfile.open(archive) as tar:
        if "/" in member and member.split("/")[0].endswith(".tar"):
            inner, name = member.split("/", 1)
            with tarfile.open(fileobj=tar.extractfile(inner)) as nested:
                return nested.extractfile(name).read()
        return tar.extractfile(member).read()


def test_sample_offsets_equal_tarfile_bytes(sample_release, tmp_path):
    """Every image of the built-in sample: one pread at the manifest offset = tarfile's extracted bytes."""
    report = run_extract(sample_release, tmp_path, materialize=True)
    assert report["reported"] == [] and report["images"]["train"] == 200 and report["images"]["val"] == 50
    for split in extract.SPLITS:
        rows = manifest(tmp_path, split)
        assert [(r["wnid"], r["name"]) for r in rows] == sorted((r["wnid"], r["name"]) for r in rows)
        for row in rows:
            source = Path(row["source"])
            assert source.is_absolute()  # the sample lies outside `root`
            fd = os.open(source, os.O_RDONLY)
            try:
                data = os.pread(fd, row["size"], row["offset"])
            finally:
                os.close(fd)
            assert data == tarfile_bytes(source, row["member"]), row
            assert (tmp_path / "imagefolder" / split / row["wnid"] / row["name"]).read_bytes() == data
    assert not list(tmp_path.glob(".imagefolder.tmp-*"))
    label_map = json.loads((tmp_path / "label_map.json").read_text())
    wnids = [c["wnid"] for c in label_map["classes"]]
    assert wnids == sorted(wnids) and [c["label"] for c in label_map["classes"]] == list(range(10))
    assert label_map["label_source"] == "devkit"


def test_outputs_deterministic_and_schema(tmp_path):
    small_release(tmp_path / "raw")
    run_extract(tmp_path / "raw", tmp_path / "a")
    run_extract(tmp_path / "raw", tmp_path / "b")
    for rel in ("manifests/train.parquet", "manifests/val.parquet", "manifests/extract_report.json", "label_map.json"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    schema = pq.read_schema(tmp_path / "a" / "manifests" / "train.parquet")
    assert schema.remove_metadata() == MANIFEST_SCHEMA
    row = manifest(tmp_path / "a", "train")[0]
    assert row["source"] == "../raw/ILSVRC2012_img_train.tar" or Path(row["source"]).is_absolute()
    assert row["member"] == "n01440764.tar/n01440764_1.JPEG"


def test_source_relative_to_root(tmp_path):
    small_release(tmp_path / "data" / "raw")
    run_extract(tmp_path / "data" / "raw", tmp_path)
    assert {r["source"] for r in manifest(tmp_path, "val")} == {"data/raw/ILSVRC2012_img_val.tar"}


def test_shuffled_devkit_ids_equal_csv_route(tmp_path):
    classes = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475"]
    train = {w: [f"{w}_{k}.JPEG" for k in (1, 2)] for w in classes}
    truth = {f"ILSVRC2012_val_{i:08d}.JPEG": classes[(i * 2) % 5] for i in range(1, 11)}
    ids = dict(zip(classes, [3, 5, 1, 4, 2]))  # ID order ≠ sorted-wnid order
    write_release(tmp_path / "raw", train, truth, ids=ids)
    csv = tmp_path / "labels.csv"
    csv.write_text("filename,wnid\n" + "".join(f"{n},{w}\n" for n, w in reversed(truth.items())))
    devkit_report = run_extract(tmp_path / "raw", tmp_path / "devkit")
    csv_report = run_extract(tmp_path / "raw", tmp_path / "csv", val_labels=str(csv))
    assert (devkit_report["label_source"], csv_report["label_source"]) == ("devkit", "csv")
    by_devkit = [(r["name"], r["wnid"], r["label"]) for r in manifest(tmp_path / "devkit", "val")]
    by_csv = [(r["name"], r["wnid"], r["label"]) for r in manifest(tmp_path / "csv", "val")]
    assert by_devkit == by_csv
    assert {n: w for n, w, _ in by_devkit} == truth
    assert all(label == classes.index(w) for _, w, label in by_devkit)
    label_map = json.loads((tmp_path / "devkit" / "label_map.json").read_text())
    assert [c["ilsvrc2012_id"] for c in label_map["classes"]] == [3, 5, 1, 4, 2]


@pytest.mark.parametrize("problem, message", [
    ("gt_short", "expected one ground-truth ID per val image"),
    ("gt_unknown_id", "unknown ID"),
    ("csv_unknown_wnid", "unknown wnid"),
    ("csv_missing_row", "without a label"),
    ("csv_extra_row", r"label\(s\) for missing images"),
])
def test_val_label_mismatches_fail(tmp_path, problem, message):
    truth = small_release(tmp_path / "raw")
    options = {}
    if problem.startswith("gt"):
        wnids = sorted(set(truth.values()))
        ids = {w: i + 1 for i, w in enumerate(wnids)}
        gt = [ids[truth[n]] for n in sorted(truth)]
        gt = gt[:-1] if problem == "gt_short" else gt[:-1] + [99]
        (tmp_path / "raw" / ARCHIVES["devkit"]).write_bytes(devkit_bytes(ids, gt))
    else:
        rows = dict(truth)
        if problem == "csv_unknown_wnid":
            rows[sorted(rows)[0]] = "n09999999"
        elif problem == "csv_missing_row":
            rows.pop(sorted(rows)[0])
        else:
            rows["ILSVRC2012_val_99999999.JPEG"] = "n01440764"
        csv = tmp_path / "labels.csv"
        csv.write_text("filename,wnid\n" + "".join(f"{n},{w}\n" for n, w in rows.items()))
        options["val_labels"] = str(csv)
    with pytest.raises(PipelineError, match=message):
        run_extract(tmp_path / "raw", tmp_path / "out", **options)
    assert not (tmp_path / "out" / "manifests").exists() and not (tmp_path / "out" / "label_map.json").exists()


def test_train_val_class_mismatch_names_differences(tmp_path):
    train = {"n01440764": ["a.JPEG"], "n01443537": ["b.JPEG"]}
    write_release(tmp_path / "raw", train, {"ILSVRC2012_val_00000001.JPEG": "n01440764",
                                            "ILSVRC2012_val_00000002.JPEG": "n01484850"})
    with pytest.raises(PipelineError, match=r"only in train \(n01443537\).*only in val \(n01484850\)"):
        run_extract(tmp_path / "raw", tmp_path / "out")


def test_class_subset_renumbers_labels(tmp_path):
    small_release(tmp_path / "raw")
    subset = tmp_path / "subset.txt"
    subset.write_text("# two cranes\nn03126707\n\nn02012849\n")
    report = run_extract(tmp_path / "raw", tmp_path / "out", classes=str(subset))
    label_map = json.loads((tmp_path / "out" / "label_map.json").read_text())
    assert [(c["label"], c["wnid"]) for c in label_map["classes"]] == [(0, "n02012849"), (1, "n03126707")]
    assert [c["name"] for c in label_map["classes"]] == ["crane (n02012849)", "crane (n03126707)"]
    for split, per_class in (("train", 3), ("val", 2)):
        rows = manifest(tmp_path / "out", split)
        assert {(r["wnid"], r["label"]) for r in rows} == {("n02012849", 0), ("n03126707", 1)}
        assert len(rows) == 2 * per_class and report["outside_subset"][split] == 2 * per_class
    subset.write_text("n03126707\nn04591713\n")
    with pytest.raises(PipelineError, match="missing 1: n04591713"):
        run_extract(tmp_path / "raw", tmp_path / "out2", classes=str(subset))


def test_imagenet100_subset_from_full_archives(tmp_path):
    cmc = [line for line in (DATA_DIR / "imagenet100_cmc.txt").read_text().split() if line]
    others = ["n01440764", "n15075141"]
    small_release(tmp_path / "raw", classes=sorted(cmc + others), per_class=1, val_per_class=1)
    report = run_extract(tmp_path / "raw", tmp_path / "out", classes="imagenet100")
    label_map = json.loads((tmp_path / "out" / "label_map.json").read_text())
    assert [c["wnid"] for c in label_map["classes"]] == sorted(cmc)
    assert report["num_classes"] == 100 and report["outside_subset"] == {"train": 2, "val": 2}


def test_bad_class_list_param_fails_early(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("n01440764\nfoo\n")
    for spec, message in ((str(bad), r"bad.txt:2: .*'foo'"), ("imagenet1000", "no such file")):
        with pytest.raises(PipelineError, match=message):
            extract.job_from_params(project(tmp_path, extract={"classes": spec}))
    with pytest.raises(PipelineError, match="extract.mode: expected one of archives, folder, archive21k, found 'zip'"):
        project(tmp_path, extract={"mode": "zip"})


def test_unique_names_over_the_full_1000():
    names = labels.unique_names(shipped_synsets())
    assert names["n02012849"] == "crane (n02012849)" and names["n03126707"] == "crane (n03126707)"
    assert names["n03710637"] == "maillot (n03710637)" and names["n01440764"] == "tench"
    assert len(set(names.values())) == 1000


# ---------------------------------------------------------------- folder mode
def make_tree(root: Path, layout: dict[str, dict[str, list[str]]]) -> None:
    for split, classes in layout.items():
        for wnid, files in classes.items():
            (root / split / wnid).mkdir(parents=True, exist_ok=True)
            for k, name in enumerate(files):
                (root / split / wnid / name).write_bytes(b"img" * (k + 1) + name.encode())


def run_folder(folder: Path, out: Path, **options) -> dict:
    for split in extract.SPLITS:
        extract.scan_folder_split_to(split, folder, out / "staging", root=out)
    return extract.finalize(out / "staging", out / "manifests", out / "label_map.json", mode="folder", **options)


def test_folder_mode_mixed_extensions_stray_file_empty_class(tmp_path):
    tree = tmp_path / "imagenet100"
    make_tree(tree, {"train": {"n01440764": ["a.JPEG", "b.jpeg", "c.JPG", "d.Png", "notes.txt"],
                               "n01443537": ["e.jpg", "f.PNG"], "n01484850": []},
                     "val": {"n01440764": ["v1.jpg"], "n01443537": ["v2.JPEG", "Thumbs.db"], "n01484850": []}})
    (tree / "train" / "README").write_text("stray")
    report = run_folder(tree, tmp_path / "out")
    rows = manifest(tmp_path / "out", "train")
    assert [(r["wnid"], r["name"]) for r in rows] == [("n01440764", n) for n in ("a.JPEG", "b.jpeg", "c.JPG", "d.Png")] \
        + [("n01443537", "e.jpg"), ("n01443537", "f.PNG")]
    assert all(r["member"] == "" and r["offset"] == 0 for r in rows)
    first = rows[0]
    assert first["source"] == "../imagenet100/train/n01440764/a.JPEG" or Path(first["source"]).is_absolute()
    assert Path(tmp_path / "out" / first["source"]).read_bytes().startswith(b"img")
    assert first["size"] == (tree / "train/n01440764/a.JPEG").stat().st_size
    reasons = {(Path(r["source"]).name, r["reason"].split(" (")[0]) for r in report["reported"]}
    assert {("notes.txt", "not an image"), ("Thumbs.db", "not an image"), ("README", "not a class folder"),
            ("n01484850", "empty class folder")} <= reasons
    label_map = json.loads((tmp_path / "out" / "label_map.json").read_text())
    assert label_map["label_source"] == "folder" and label_map["num_classes"] == 2
    assert label_map["classes"][0] == {"label": 0, "wnid": "n01440764", "name": "tench",
                                       "words": "tench, Tinca tinca", "ilsvrc2012_id": None}


def test_folder_mode_empty_val_class_fails_naming_it(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"train": {"n01440764": ["a.JPEG"], "n01443537": ["b.JPEG"]},
                     "val": {"n01440764": ["c.JPEG"], "n01443537": ["notes.txt"]}})
    with pytest.raises(PipelineError, match=r"1 only in train \(n01443537\)"):
        run_folder(tree, tmp_path / "out")


def test_folder_mode_without_images_fails(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"train": {"n01440764": ["a.txt"]}, "val": {"n01440764": []}})
    with pytest.raises(PipelineError, match="expected images of at least one class, found none"):
        run_folder(tree, tmp_path / "out")


def test_folder_mode_unknown_wnid_fails(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {"train": {"n09999999": ["a.JPEG"]}, "val": {"n09999999": ["c.JPEG"]}})
    with pytest.raises(PipelineError, match="unknown wnid.*n09999999"):
        run_folder(tree, tmp_path / "out")


# ---------------------------------------------------------------- real facts
@pytest.mark.real_data
def test_real_val_ground_truth_csv_and_cmc_list(shared_data):
    mapping = read_label_csv(shared_data / "imagenet" / "val_ground_truth.csv")
    synsets = shipped_synsets()
    assert len(mapping) == 50_000 and set(mapping.values()) == set(synsets)
    assert sorted(mapping)[0] == "ILSVRC2012_val_00000001.JPEG"
    cmc = read_class_list(shared_data / "imagenet" / "imagenet100_cmc.txt")
    assert len(cmc) == 100 and set(cmc) <= set(synsets)
    assert cmc == read_class_list("imagenet100")  # the shipped copy = the shared facts


def test_class_tars_in_a_subfolder_of_the_train_archive(tmp_path):
    """A train archive whose class tars sit under a folder still indexes and materializes."""
    small_release(tmp_path / "raw")
    train = tmp_path / "raw" / ARCHIVES["train"]
    with tarfile.open(train) as tar:
        members = [(f"ILSVRC2012_img_train/{m.name}", tar.extractfile(m).read()) for m in tar.getmembers()]
    train.write_bytes(tar_bytes(members))
    run_extract(tmp_path / "raw", tmp_path / "out", materialize=True)
    rows = manifest(tmp_path / "out", "train")
    assert rows[0]["member"] == "ILSVRC2012_img_train/n01440764.tar/n01440764_1.JPEG"
    for row in rows:
        tree_file = tmp_path / "out" / "imagefolder" / "train" / row["wnid"] / row["name"]
        with open(train, "rb") as fh:
            fh.seek(row["offset"])
            assert tree_file.read_bytes() == fh.read(row["size"])

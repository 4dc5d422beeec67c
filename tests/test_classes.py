"""Any class names in folder mode (issue 22, part 1): labels exactly as torchvision's ImageFolder numbers them, the
label map / ClassLabel names are the folder names, `wnid` null unless every folder is a wnid; class subsets,
curation and the per-class bounds by these names; unsafe names refused; a tree without val held out of train.

torchvision is not installed: the reference is ImageFolder's documented rule (torchvision.datasets.folder.
find_classes): `classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())`,
`class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}`, every file of `<root>/<class>/` with an image
extension labelled `class_to_idx[class]`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset
from tasks.common import PipelineError
from tasks.curate import lines as curate
from tasks.curate import stage as curate_stage
from tasks.extract import stage as extract
from tasks.extract.holdout import holdout_value
from tasks.validate.dataset_checks import class_table, count_summary
from tests.helpers.datasets import small_jpeg
from tests.helpers.docs import readme_params
from tests.helpers.params import project, write_params
from tests.helpers.project import copy_project
from tests.test_curate import curate_out, overlaid, write_converted
from tests.test_extract import make_tree, run_folder
from tests.test_remote import _run

# spaces, "é" (and "É", which sorts after every lowercase ASCII letter), dots, mixed case, "10" before "9"
NAMES = ["10", "9", "Zebra", "apple", "café", "dots.in.name", "has space", "Éclair", "n01440764x"]


def imagefolder_labels(root: Path) -> dict[tuple[str, str], int]:
    """(class folder, file name) -> label by torchvision ImageFolder's rule (see the module docstring)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    return {
        (name, file.name): class_to_idx[name]
        for name in classes
        for file in sorted((root / name).iterdir())
        if file.suffix.lower() in (".jpg", ".jpeg", ".png")
    }


def _write_tree(root: Path, names: list[str], per_split: dict[str, int]) -> dict[str, bytes]:
    """Real tiny JPEGs, a file name unique over the tree (so a shard row names its folder); name -> bytes."""
    files = {}
    for split, count in per_split.items():
        for c, name in enumerate(names):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                data = small_jpeg(1000 * c + 10 * i + (split == "val"))
                file = f"{split}_{c:02d}_{i}.{'JPEG' if i % 2 else 'jpg'}"
                (root / split / name / file).write_bytes(data)
                files[file] = data
    return files


def test_any_folder_names_get_imagefolder_labels_through_dvc_repro(tmp_path, prefect_api):
    tree = tmp_path / "tree"
    files = _write_tree(tree, NAMES, {"train": 3, "val": 2})
    repo = copy_project(tmp_path / "project")
    write_params(repo, extract=readme_params("own-imagenet100", extract__folder=str(tree))["extract"])
    _run(["dvc", "repro"], repo)
    label_map = json.loads((repo / "data/label_map.json").read_text())
    assert [c["name"] for c in label_map["classes"]] == sorted(NAMES)  # str sort: "10" < "9" < "Zebra" < "apple"
    assert all(c["wnid"] is None and c["words"] is None for c in label_map["classes"])
    for split in ("train", "val"):
        reference = imagefolder_labels(tree / split)
        folder_of = {file: name for name, file in reference}
        dataset = ParquetImageDataset(repo / "data/parquet", split, decode=False)
        assert dataset.classes == sorted(NAMES) and dataset.label_names == sorted(NAMES)
        assert dataset.class_to_idx == {name: label for (name, _), label in reference.items()}
        rows = pq.read_table(repo / f"data/parquet/{split}").to_pylist()
        found = {(folder_of[r["image"]["path"]], r["image"]["path"]): r["label"] for r in rows}
        assert found == reference  # every image, the label ImageFolder gives it
        assert all(r["wnid"] is None and r["label_name"] == folder_of[r["image"]["path"]] for r in rows)
        assert all(r["image"]["bytes"] == files[r["image"]["path"]] for r in rows)
        features = json.loads(pq.read_schema(next((repo / f"data/parquet/{split}").glob("*.parquet"))).metadata[
            b"huggingface"])["info"]["features"]
        assert features["label"]["names"] == sorted(NAMES)
    report = json.loads((repo / "data/reports/schema_report.json").read_text())
    assert all(check["status"] != "fail" for check in report["checks"]), report["checks"]


def test_subsets_curation_and_relabels_by_folder_name(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {split: {name: [f"{split}{k}.jpg" for k in range(3)] for name in NAMES}
                     for split in ("train", "val")})
    (tmp_path / "classes.txt").write_text("# a subset by folder name\nhas space\ncafé  # inline comment\n9\n10\n")
    (tmp_path / "exclude.csv").write_text("split,wnid,name,reason\ntrain,café,train0.jpg,blurry\n")
    (tmp_path / "relabel.csv").write_text("split,wnid,name,new_wnid,reason\nval,9,val1.jpg,10,wrong folder\n")
    curation = curate.read_curation(tmp_path / "exclude.csv", tmp_path / "relabel.csv")
    out = tmp_path / "out"
    report = run_folder(tree, out, classes=str(tmp_path / "classes.txt"))
    label_map = json.loads((out / "label_map.json").read_text())
    assert [(c["label"], c["name"], c["wnid"]) for c in label_map["classes"]] == [
        (0, "10", None), (1, "9", None), (2, "café", None), (3, "has space", None)]
    curated = curate_out(out, curation)  # the curate stage: the manifests stay as extracted, the overlay moves
    val = pq.read_table(out / "manifests/val.parquet").to_pylist()
    assert ("9", "val1.jpg", 1) in [(r["wnid"], r["name"], r["label"]) for r in val]
    assert ("10", "val1.jpg") in overlaid(out / "parquet", out / "label_map.json", "val")
    train = pq.read_table(out / "manifests/train.parquet").to_pylist()
    assert ("café", "train0.jpg") in [(r["wnid"], r["name"]) for r in train]
    assert ("café", "train0.jpg") not in overlaid(out / "parquet", out / "label_map.json", "train")
    assert curated["relabel"]["val"]["by_class"] == {"9->10": 1}
    assert curated["exclude"]["train"]["by_class"] == {"café": 1}
    assert report["catalog"] is None and report["num_classes"] == 4
    (tmp_path / "bad.csv").write_text("split,wnid,name,reason\ntrain,ca\x01fé,train0.jpg,x\n")
    with pytest.raises(PipelineError, match=r"bad.csv:2: expected wnid a class name, found .*control character"):
        curate.read_curation(tmp_path / "bad.csv", None)


def test_a_class_list_names_folders_exactly_a_trailing_space_is_another_class(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {split: {name: [f"{split}{k}.jpg" for k in range(2)] for name in ("cat", "cat ", "dog")}
                     for split in ("train", "val")})
    (tmp_path / "classes.txt").write_text("cat \ndog  # a comment: the spaces before it are the comment's\n")
    out = tmp_path / "out"
    run_folder(tree, out, classes=str(tmp_path / "classes.txt"))
    label_map = json.loads((out / "label_map.json").read_text())
    assert [c["name"] for c in label_map["classes"]] == ["cat ", "dog"]
    train = pq.read_table(out / "manifests/train.parquet").to_pylist()
    assert sorted({r["wnid"] for r in train}) == ["cat ", "dog"]


@pytest.mark.parametrize("name, found", [
    ("bad\x01name", "control character"),
    ("line\nbreak", "control character"),
    ("back\\slash", "path separator"),
    (os.fsdecode(b"latin1-\xe9"), "not valid UTF-8"),
])
def test_a_class_folder_that_is_not_a_safe_component_is_refused_naming_it(tmp_path, name, found):
    tree = tmp_path / "tree"
    make_tree(tree, {"train": {"ok": ["a.jpg"], name: ["b.jpg"]}, "val": {"ok": ["c.jpg"], name: ["d.jpg"]}})
    with pytest.raises(PipelineError) as err:
        run_folder(tree, tmp_path / "out")
    message = str(err.value)
    assert message.startswith(str(tree / "train")) and "expected a class folder named by one safe path" in message
    assert found in message and "rename or remove it" in message
    assert not (tmp_path / "out/manifests").exists()


def test_wnid_folders_beyond_the_1000_with_a_derived_or_supplied_catalog(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {split: {"n09999999": ["a.jpg"], "n01440764": ["b.jpg"]} for split in ("train", "val")})
    with pytest.raises(PipelineError, match=r"unknown wnid\(s\): n09999999.*extract.catalog"):
        run_folder(tree, tmp_path / "shipped")  # as before: the shipped 1000 by default
    run_folder(tree, tmp_path / "derived", catalog="derived")
    derived = json.loads((tmp_path / "derived/label_map.json").read_text())["classes"]
    assert [(c["wnid"], c["name"], c["words"]) for c in derived] == [
        ("n01440764", "n01440764", ""), ("n09999999", "n09999999", "")]
    (tmp_path / "words.tsv").write_text("wnid\twords\nn01440764\ttench, Tinca tinca\nn09999999\tsomething, thing\n")
    run_folder(tree, tmp_path / "table", catalog=str(tmp_path / "words.tsv"))
    table = json.loads((tmp_path / "table/label_map.json").read_text())["classes"]
    assert [(c["label"], c["wnid"], c["name"], c["words"]) for c in table] == [
        (0, "n01440764", "tench", "tench, Tinca tinca"), (1, "n09999999", "something", "something, thing")]
    (tmp_path / "words.tsv").write_text("n01440764\ttench\nn01440764\tagain\n")
    with pytest.raises(PipelineError, match=r"words.tsv:2: expected wnid<TAB>words .*'n01440764' again"):
        run_folder(tree, tmp_path / "dup", catalog=str(tmp_path / "words.tsv"))
    named = tmp_path / "named"
    make_tree(named, {split: {"cats": ["a.jpg"]} for split in ("train", "val")})
    with pytest.raises(PipelineError, match=r"extract.catalog: expected auto for class folders not named by wnid"):
        run_folder(named, tmp_path / "named-out", catalog="derived")


def test_per_class_bounds_name_the_folder():
    label_map = {"classes": [{"label": 0, "wnid": None, "name": "has space"}, {"label": 1, "wnid": None, "name": "é"}]}
    meta = pd.DataFrame({"split": ["train"] * 3 + ["val"] * 2, "label": [0, 0, 1, 0, 1]})
    summary = count_summary(class_table(meta, label_map), {"train": [2, 5], "val": [1, 1]})
    assert summary["train"]["out_of_bounds"] == [{"label": 1, "wnid": "é", "name": "é", "count": 1}]


def _holdout_tree(root: Path, per_class: int, classes: int = 6) -> None:
    make_tree(root, {"train": {f"class {c}": [f"img{c}_{i}.jpg" for i in range(per_class)] for c in range(classes)}})


def _held_out(root: Path, tree: Path, seed: int = 0) -> tuple[dict, dict[str, str]]:
    """The extract stage's job from params (folder mode, a holdout) in project `root`: (report, image -> split)."""
    setup = project(root, extract={"mode": "folder", "folder": str(tree), "holdout": {"fraction": 0.3, "seed": seed}})
    job = extract.job_from_params(setup)
    for split in extract.SPLITS:
        extract.scan_split(job, split)
    report = extract.finalize_job(job)
    splits = {r["name"]: split for split in extract.SPLITS
              for r in pq.read_table(job.manifests / f"{split}.parquet").to_pylist()}
    return report, splits


def test_a_tree_without_val_is_held_out_of_train_and_stays_put_when_images_are_added(tmp_path):
    _holdout_tree(tmp_path / "v1", 20)
    first, before = _held_out(tmp_path / "p1", tmp_path / "v1")
    assert 0.15 < first["holdout"]["images"]["val"] / len(before) < 0.45
    assert first["holdout"]["classes_without_val"] == 0 and set(before.values()) == {"train", "val"}
    again, same = _held_out(tmp_path / "p2", tmp_path / "v1")
    assert (again, same) == (first, before)  # deterministic
    assert (tmp_path / "p2/data/manifests/val.parquet").read_bytes() != b""
    _holdout_tree(tmp_path / "v2", 60, classes=7)  # 40 more images per class, and a new class
    _, after = _held_out(tmp_path / "p3", tmp_path / "v2")
    assert {name: after[name] for name in before} == before  # no old image moved between train and val
    assert "val" in {after[n] for n in set(after) - set(before)}
    _, other_seed = _held_out(tmp_path / "p4", tmp_path / "v1", seed=1)
    assert other_seed != before and set(other_seed) == set(before)


def test_holdout_needs_no_val_folder_and_no_val_folder_needs_holdout(tmp_path):
    _holdout_tree(tmp_path / "tree", 4)
    with pytest.raises(PipelineError, match=r"tree/val: expected the val folder .* \(or, for a source without a val "
                                            r"split, set extract.holdout"):
        run_folder(tmp_path / "tree", tmp_path / "out")
    (tmp_path / "tree/val").mkdir()
    setup = project(tmp_path, extract={"mode": "folder", "folder": "tree", "holdout": {"fraction": 0.5, "seed": 0}})
    job = extract.job_from_params(setup)
    with pytest.raises(PipelineError, match=r"tree/val: expected no val folder with extract.holdout set"):
        extract.scan_split(job, "val")
    with pytest.raises(PipelineError, match=r"extract.holdout.fraction: expected a number > 0 and < 1, found 0"):
        project(tmp_path, extract={"mode": "folder", "folder": "tree", "holdout": {"fraction": 0, "seed": 0}})
    with pytest.raises(PipelineError, match=r"extract.catalog: expected auto and holdout: null with mode: archives"):
        project(tmp_path, extract={"holdout": {"fraction": 0.5, "seed": 0}})


def test_the_readme_holdout_example_through_dvc_repro(tmp_path, prefect_api):
    """README "Any image-classification folder": a tree without val/, val held out of train by `extract.holdout`."""
    tree = tmp_path / "tree"
    files = _write_tree(tree, NAMES[:4], {"train": 12})
    repo = copy_project(tmp_path / "project")
    # the README's snippet as written, but for the location, a fraction that leaves 12 images a class a val image,
    # and the train bounds of a miniature
    snippet = readme_params("own-folder", extract__folder=str(tree), extract__holdout={"fraction": 0.4, "seed": 0})
    write_params(repo, extract=snippet["extract"], validate={**snippet["validate"], "train_count": [1, 5000]})
    _run(["dvc", "repro"], repo)
    reference = imagefolder_labels(tree / "train")
    folder_of = {file: name for name, file in reference}
    rows = {split: pq.read_table(repo / f"data/parquet/{split}").to_pylist() for split in ("train", "val")}
    held = {r["image"]["path"] for r in rows["val"]}
    threshold = int(0.4 * (1 << 64))  # folder mode hashes class/name (holdout v2)
    assert held == {f for f in files if holdout_value(f, 0, folder_of[f]) < threshold} and len(held) < len(files)
    labelled = {(folder_of[r["image"]["path"]], r["image"]["path"]): r["label"] for s in rows.values() for r in s}
    assert labelled == reference
    report = json.loads((repo / "data/reports/schema_report.json").read_text())
    assert all(check["status"] != "fail" for check in report["checks"]), report["checks"]


# ---------------------------------------------------------------- main's curation checks (issue 21) with folder names
def _curated(root: Path, exclude: str = "", relabel: str = "") -> curate.Curation:
    (root / "exclude.csv").write_text("split,wnid,name,reason\n" + exclude, encoding="utf-8")
    (root / "relabel.csv").write_text("split,wnid,name,new_wnid,reason\n" + relabel, encoding="utf-8")
    return curate.read_curation(root / "exclude.csv", root / "relabel.csv")


@pytest.mark.parametrize("exclude, relabel, line, found", [
    ("val,café,v1.jpg,blurry\n", "", "exclude.csv:2", "expected class café left with images in val"),
    ("", "val,café,v1.jpg,has space,wrong\n", "relabel.csv:2", "expected class café left with images in val"),
    ("", "val,has space,v2.jpg,new name,wrong\n", "relabel.csv:2",
     "expected new_wnid a class of the dataset (label_map.json: the classes extract keeps; a relabel never drops), "
     "found 'new name'"),
])
def test_curation_lines_unbalancing_folder_named_classes_name_the_line(tmp_path, exclude, relabel, line, found):
    tree = tmp_path / "tree"
    make_tree(tree, {"train": {"café": ["t1.jpg"], "has space": ["t2.jpg"]},
                     "val": {"café": ["v1.jpg"], "has space": ["v2.jpg", "v3.jpg"]}})
    run_folder(tree, tmp_path / "out")
    with pytest.raises(PipelineError) as err:
        curate_out(tmp_path / "out", _curated(tmp_path, exclude, relabel))
    message = str(err.value)
    assert message.startswith(f"{tmp_path}/{line}: ") and found in message, message
    assert "tree/" not in message and not (tmp_path / "out/overlay").exists()


def test_a_relabel_by_folder_name_outside_the_subset_is_refused(tmp_path):
    tree = tmp_path / "tree"
    make_tree(tree, {split: {name: [f"{split}{name}.jpg"] for name in ("a b", "c", "é")} for split in ("train", "val")})
    (tmp_path / "classes.txt").write_text("a b\nc\n")
    run_folder(tree, tmp_path / "out", classes=str(tmp_path / "classes.txt"))
    with pytest.raises(PipelineError) as err:  # the label map holds the subset only: é is no class of the dataset
        curate_out(tmp_path / "out", _curated(tmp_path, "", "train,c,trainc.jpg,é,wrong\n"))
    message = str(err.value)
    assert message.startswith(f"{tmp_path}/relabel.csv:2: expected new_wnid a class of the dataset")
    assert "found 'é'" in message and not (tmp_path / "out/overlay").exists()


def test_with_a_holdout_curation_may_leave_val_without_a_class(tmp_path):
    _holdout_tree(tmp_path / "tree", 20, classes=2)
    _, splits = _held_out(tmp_path / "p0", tmp_path / "tree")
    held = sorted(name for name, split in splits.items() if split == "val" and name.startswith("img0_"))
    assert held  # val holds images of class 0: exclude them all
    lines = "".join(f"val,class 0,{name},blurry\n" for name in held)
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1/curation").mkdir()
    (tmp_path / "p1/curation/exclude.csv").write_text("split,wnid,name,reason\n" + lines)
    setup = project(tmp_path / "p1", extract={"mode": "folder", "folder": str(tmp_path / "tree"),
                                              "holdout": {"fraction": 0.3, "seed": 0}},
                    curate={"exclude": "curation/exclude.csv", "relabel": None})
    job = extract.job_from_params(setup)
    for split in extract.SPLITS:
        extract.scan_split(job, split)
    report = extract.finalize_job(job)
    assert report["num_classes"] == 2 and "curation" not in report
    write_converted(job.manifests, job.label_map, setup.path("parquet"), setup.root)
    curated = curate_stage.write_overlays(curate_stage.job_from_params(setup))  # held out: no class check refuses
    assert curated["exclude"]["val"]["lines"] == len(held)
    val = pq.read_table(job.manifests / "val.parquet").column("wnid").to_pylist()
    assert set(val) == {"class 0", "class 1"}  # the manifests as extracted
    assert {wnid for wnid, _ in overlaid(setup.path("parquet"), job.label_map, "val")} == {"class 1"}

"""Folder mode labels every image as torchvision's ImageFolder does (issue 28 items 6, 8, 9) on awkward trees:
images only in sub-folders, hidden folders, ImageFolder's extensions in any case, symlinked files and folders,
the same file name in two sub-folders of a class; symlink loops refused naming the path; NFC/NFD twins warned.

`imagefolder` below is torchvision's rule written out (torchvision/datasets/folder.py: `find_classes`,
`make_dataset`, `has_file_allowed_extension`, IMG_EXTENSIONS); where torchvision is installed the rule is also
checked against it."""
from __future__ import annotations

import json
import logging
import os
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.common import PipelineError
from tasks.convert.imaging import Policy, encode_image
from tasks.extract import stage as extract
from tests.helpers.datasets import small_jpeg
from tests.test_extract import run_folder

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def imagefolder(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision's ImageFolder(root): (classes, [(path, label)]); FileNotFoundError for a class without images."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    samples, available = [], set()
    for target in sorted(class_to_idx):
        directory = os.path.join(root, target)
        if not os.path.isdir(directory):
            continue
        for parent, _, fnames in sorted(os.walk(directory, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(parent, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    samples.append((path, class_to_idx[target]))
                    available.add(target)
    if set(classes) - available:
        raise FileNotFoundError(f"Found no valid file for the classes {sorted(set(classes) - available)}")
    return classes, samples


def ours(out: Path, split: str) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, [(path of the image as ImageFolder spells it, label)]) of the extract stage's outputs."""
    label_map = json.loads((out / "label_map.json").read_text(encoding="utf-8"))
    rows = pq.read_table(out / "manifests" / f"{split}.parquet").to_pylist()
    classes = [c["wnid"] or c["name"] for c in label_map["classes"]]
    return classes, sorted((os.path.normpath(out / r["source"]), r["label"]) for r in rows)


def _image(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(small_jpeg(seed))


def _assert_as_imagefolder(tree: Path, out: Path) -> dict:
    report = run_folder(tree, out)
    for split in ("train", "val"):
        classes, samples = imagefolder(tree / split)
        assert ours(out, split) == (classes, sorted((os.path.normpath(p), t) for p, t in samples))
    return report


AWKWARD = {  # class folder -> image files (relative paths) of one split
    ".ipynb_checkpoints": ["sub/x.JPEG"],  # hidden, images only in a sub-folder
    "aardvark": ["a.jpg", "b.Png"],
    "bee": ["sub/x.jpg"],  # nested only
    "cat": ["a/x.jpg", "b/x.jpg", "x.jpg"],  # one file name three times in one class
    "deep": ["1/2/3/4/y.jpeg"],
    "eel": ["w.WEBP"],  # only ImageFolder's extra extensions
    "fox": ["p.ppm", "b.BMP", "g.pgm", "t.tif", "t2.TIFF", "z.webp"],
    "gnu": [".hidden.jpg", ".dir/h.jpg"],
}


def _awkward_tree(tree: Path) -> None:
    for split in ("train", "val"):
        for k, (cls, files) in enumerate(sorted(AWKWARD.items())):
            for i, name in enumerate(files):
                _image(tree / split / cls / name, 100 * k + i)
            (tree / split / cls / "notes.txt").write_text("not an image")
        (tree / split / "stray.jpg").write_bytes(small_jpeg(7))  # a file beside the classes: no class


def test_nested_hidden_and_extra_extension_classes_get_imagefolder_labels(tmp_path):
    _awkward_tree(tmp_path / "tree")
    _assert_as_imagefolder(tmp_path / "tree", tmp_path / "out")
    rows = pq.read_table(tmp_path / "out/manifests/train.parquet").to_pylist()
    assert sorted(r["name"] for r in rows if r["wnid"] == "cat") == ["a/x.jpg", "b/x.jpg", "x.jpg"]
    assert [r["name"] for r in rows if r["wnid"] == "bee"] == ["sub/x.jpg"]


def test_symlinked_files_and_folders_count_as_imagefolder_counts_them(tmp_path):
    outside = tmp_path / "elsewhere"
    _image(outside / "pics/o.jpg", 1)
    _image(outside / "single.png", 2)
    _image(outside / "whole_class/w.jpg", 3)
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        _image(tree / split / "ant/a.jpg", 4)
        (tree / split / "ant/linked_dir").symlink_to(outside / "pics")
        (tree / split / "ant/linked.png").symlink_to(outside / "single.png")
        (tree / split / "bat").mkdir(parents=True)
        (tree / split / "bat/only_link").symlink_to(outside / "pics")  # images only behind a linked folder
        (tree / split / "cow").symlink_to(outside / "whole_class")  # the class folder itself is a link
        (tree / split / "dup").symlink_to(tree / split / "ant", target_is_directory=True)  # same images, 2 classes
    _assert_as_imagefolder(tree, tmp_path / "out")


def test_a_class_imagefolder_counts_but_whose_images_cannot_be_indexed_is_refused(tmp_path):
    """ImageFolder counts a dangling `x.jpg` link as an image: a class holding only that must not vanish."""
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        _image(tree / split / "ant/a.jpg")
        (tree / split / "bat/deeper").mkdir(parents=True)
        (tree / split / "bat/deeper/dead.jpg").symlink_to(tmp_path / "missing.jpg")
    with pytest.raises(PipelineError, match=r"bat: expected .*ImageFolder.* found 1 .*dead\.jpg"):
        run_folder(tree, tmp_path / "out")


def test_a_dangling_link_beside_images_is_reported_and_labels_still_match(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        for cls in ("ant", "bat"):
            _image(tree / split / cls / "a.jpg")
        (tree / split / "ant/dead.jpg").symlink_to(tmp_path / "missing.jpg")
    report = run_folder(tree, tmp_path / "out")
    assert ours(tmp_path / "out", "train")[0] == imagefolder(tree / "train")[0] == ["ant", "bat"]
    assert any(r["source"].endswith("ant/dead.jpg") and "not a regular file" in r["reason"] for r in report["reported"])


def test_every_imagefolder_extension_converts(tmp_path):
    """What ImageFolder counts, convert stores (as JPEG): no extension is indexed that convert cannot take."""
    from PIL import Image

    steps = {}
    for ext, fmt, mode in [(".ppm", "PPM", "RGB"), (".pgm", "PPM", "L"), (".bmp", "BMP", "RGB"),
                           (".tif", "TIFF", "RGB"), (".webp", "WEBP", "RGB"), (".png", "PNG", "RGBA")]:
        path = tmp_path / f"x{ext}"
        Image.new(mode, (9, 7), 90).save(path, format=fmt)
        encoded = encode_image(path.read_bytes(), Policy())
        assert (encoded.width, encoded.height) == (9, 7)
        steps[ext] = encoded.transform
    assert steps[".webp"].startswith("webp_to_jpeg") and steps[".tif"].startswith("tiff_to_jpeg")


@pytest.mark.parametrize("link, target", [
    ("ant/loop", "."),  # the class folder itself
    ("ant/sub/up", ".."),  # a parent inside the class
    ("ant/sub/split", "../.."),  # the split folder (holding the class again)
    ("ant/sub/deeper/root", "../../.."),
])
def test_a_symlink_loop_inside_a_class_is_one_clear_error_naming_it(tmp_path, link, target):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        _image(tree / split / "ant/sub/deeper/a.jpg")
        _image(tree / split / "bee/b.jpg")
    (tree / "train" / link).symlink_to(target)
    with pytest.raises(PipelineError, match=rf"train/{link}: expected .* found a symbolic link loop.*remove"):
        run_folder(tree, tmp_path / "out")


@pytest.mark.parametrize("links", [
    {"ant": "bee", "bee": "ant"},  # two class folders linking to each other
    {"self": "self"},  # a link to itself
])
def test_a_symlink_loop_among_class_folders_is_one_clear_error_naming_it(tmp_path, links):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        _image(tree / split / "cow/c.jpg")
    for name, target in links.items():
        (tree / "train" / name).symlink_to(target)
    first = sorted(links)[0]
    with pytest.raises(PipelineError, match=rf"train/{first}: expected .* found a symbolic link loop"):
        run_folder(tree, tmp_path / "out")


def test_nfc_and_nfd_spellings_of_one_class_are_kept_and_warned(tmp_path, caplog):
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert composed != decomposed
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        for k, cls in enumerate((composed, decomposed, "tea")):
            _image(tree / split / cls / f"{k}.jpg", k)
    with caplog.at_level(logging.WARNING):
        report = _assert_as_imagefolder(tree, tmp_path / "out")
    assert report["num_classes"] == 3  # kept apart, as ImageFolder keeps them
    twins = [r for r in report["reported"] if "Unicode" in r["reason"]]
    assert [r["split"] for r in twins] == ["train", "val"]
    assert twins[0]["action"].startswith("kept") and composed in twins[0]["member"] and decomposed in twins[0]["member"]
    assert any("Unicode" in message for message in caplog.messages)


def test_the_rule_written_out_is_torchvisions(tmp_path):
    folder = pytest.importorskip("torchvision.datasets.folder")
    assert tuple(folder.IMG_EXTENSIONS) == IMG_EXTENSIONS
    _awkward_tree(tmp_path / "tree")
    dataset = folder.ImageFolder(str(tmp_path / "tree/train"))
    assert (dataset.classes, sorted(dataset.samples)) == tuple(map(sorted, imagefolder(tmp_path / "tree/train")))


def test_a_class_of_only_undecodable_imagefolder_files_keeps_its_label_and_fails_validate(tmp_path):
    """`._a.jpg` (macOS AppleDouble junk) is an image to ImageFolder: the class keeps its label (no later label
    moves), convert quarantines the file, and validate fails on the class left without images."""
    from tasks.convert.distribute import run_local
    from tasks.convert.job import job_from_params
    from tasks.curate import stage as curate
    from tasks.validate.stage import run_validation
    from tests.helpers.params import project, validate_section

    tree, root = tmp_path / "tree", tmp_path / "project"
    for split in ("train", "val"):
        for k, cls in enumerate(("ant", "cow")):
            _image(tree / split / cls / "a.jpg", 10 * k + (split == "val"))
        (tree / split / "bee").mkdir()
        (tree / split / "bee/._a.jpg").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    setup = project(root, convert={"max_bad_fraction": 1.0})
    where = setup.paths
    for split in ("train", "val"):
        extract.scan_folder_split_to(split, tree, where["work"] / "extract", root=root)
    extract.finalize(where["work"] / "extract", where["manifests"], where["label_map"], mode="folder")
    label_map = json.loads(where["label_map"].read_text(encoding="utf-8"))
    assert [c["name"] for c in label_map["classes"]] == imagefolder(tree / "train")[0] == ["ant", "bee", "cow"]
    run_local(job_from_params(setup.params.convert, where, root=root), progress=False)
    bad = [json.loads(line) for line in (where["parquet"] / "bad_images.jsonl").read_text().splitlines()]
    assert sorted(b["name"] for b in bad) == ["._a.jpg", "._a.jpg"]
    curate.write_overlays(curate.job_from_params(setup))
    report = run_validation(where["parquet"], where["manifests"], where["label_map"], validate_section())
    check = next(c for c in report["checks"] if c["name"] == "class_set")
    assert check["status"] == "fail" and "bee" in check["message"], check["message"]


def test_a_class_spelled_nfc_in_train_and_nfd_in_val_is_refused_saying_so(tmp_path):
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    tree = tmp_path / "tree"
    for split, cls in (("train", composed), ("val", decomposed)):
        _image(tree / split / cls / "a.jpg")
        _image(tree / split / "tea/b.jpg")
    with pytest.raises(PipelineError, match=r"only in train .* differ only in Unicode normalization"):
        run_folder(tree, tmp_path / "out")

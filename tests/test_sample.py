"""The built-in sample: real ILSVRC2012 layout, devkit metadata, quirks, byte-identical output."""
from __future__ import annotations

import gzip
import hashlib
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from tasks.acquire.sample import write_sample
from tasks.common import ARCHIVES
from tasks.common.synsets import load_synsets
from tests.helpers.archives import read_devkit


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _train_images(train_tar: Path) -> dict[str, bytes]:
    images = {}
    with tarfile.open(train_tar) as outer:
        for member in outer.getmembers():
            assert re.fullmatch(r"n\d{8}\.tar", member.name), member.name
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                for image in inner.getmembers():
                    assert image.name.startswith(member.name[:-4] + "_"), image.name
                    images[image.name] = inner.extractfile(image).read()
    return images


def test_layout_and_md5_table(sample_release: Path):
    table = (sample_release / "sample_md5.tsv").read_text().splitlines()
    assert table[0] == "name\tmd5"
    assert dict(line.split("\t") for line in table[1:]) == {n: _md5(sample_release / n) for n in ARCHIVES.values()}
    images = _train_images(sample_release / ARCHIVES["train"])
    assert len(images) == 10 * 20
    widths = {len(re.search(r"_(\d+)\.JPEG$", name).group(1)) for name in images}
    assert len(widths) > 1, "image numbers must not be fixed-width"
    with tarfile.open(sample_release / ARCHIVES["val"]) as val:
        names = val.getnames()
    assert names == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 51)]
    sizes = [Image.open(io.BytesIO(data)).size for data in images.values()]
    assert all(300 <= min(s) and max(s) <= 500 for s in sizes)
    assert 10_000 < sum(map(len, images.values())) / len(images) < 200_000


def test_devkit_metadata_is_shaped_like_the_real_one(sample_release: Path):
    synsets, truth = read_devkit(sample_release / ARCHIVES["devkit"])
    assert synsets.dtype.names == ("ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
                                   "wordnet_height", "num_train_images")
    leaves = [s for s in synsets if s["num_children"] == 0]
    inner = [s for s in synsets if s["num_children"] > 0]
    assert sorted(int(s["ILSVRC2012_ID"]) for s in leaves) == list(range(1, 11))
    assert inner and all(int(s["ILSVRC2012_ID"]) > 10 for s in inner)
    by_wnid = sorted(leaves, key=lambda s: s["WNID"])
    assert [int(s["ILSVRC2012_ID"]) for s in by_wnid] != list(range(1, 11)), "IDs must not follow wnid order"
    real = dict(load_synsets())
    assert all(real[s["WNID"]] == s["words"] for s in leaves)
    assert len(truth) == 50 and sorted(set(truth)) == list(range(1, 11)) and truth.count(truth[0]) == 5
    train_wnids = {name.split("_")[0] for name in _train_images(sample_release / ARCHIVES["train"])}
    assert train_wnids == {s["WNID"] for s in leaves}


def test_quirks_present(sample_release: Path):
    found = set()
    for name, data in _train_images(sample_release / ARCHIVES["train"]).items():
        image = Image.open(io.BytesIO(data))
        found.add((image.format, image.mode, image.getexif().get(0x0112, 1)))
    assert ("JPEG", "CMYK", 1) in found and ("JPEG", "L", 1) in found
    assert ("PNG", "RGB", 1) in found and ("JPEG", "RGB", 6) in found
    with tarfile.open(sample_release / ARCHIVES["val"]) as val:
        modes = {Image.open(val.extractfile(m)).mode for m in val.getmembers()}
    assert {"L", "CMYK", "RGB"} <= modes


def test_byte_identical_across_runs_and_seed_matters(tmp_path: Path):
    first = write_sample(tmp_path / "a", classes=3, train_per_class=4, val_per_class=2, seed=7)
    cmd = [sys.executable, "-m", "tasks.acquire.sample", str(tmp_path / "b"), "--classes", "3", "--train-per-class", "4",
           "--val-per-class", "2", "--seed", "7"]
    subprocess.run(cmd, check=True, capture_output=True)
    for name in [*ARCHIVES.values(), "sample_md5.tsv"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    header = (tmp_path / "a" / ARCHIVES["devkit"]).read_bytes()[:10]
    assert header[3] & 0x08 == 0 and header[4:8] == b"\0\0\0\0", "gzip header must carry no name and no mtime"
    assert gzip.decompress((tmp_path / "a" / ARCHIVES["devkit"]).read_bytes())
    other = write_sample(tmp_path / "c", classes=3, train_per_class=4, val_per_class=2, seed=8)
    assert other[ARCHIVES["train"]] != first[ARCHIVES["train"]]


def test_real_images_folder(tmp_path: Path, shared_data: Path):
    folder = shared_data / "imagenet-samples"
    write_sample(tmp_path, classes=2, train_per_class=4, val_per_class=2, real_images=folder)
    real = {p.read_bytes() for p in sorted(folder.iterdir())[:12]}
    images = _train_images(tmp_path / ARCHIVES["train"])
    assert sum(data in real for data in images.values()) == len(images) - 4  # all but the four quirk files


def test_bad_arguments(tmp_path: Path):
    with pytest.raises(ValueError, match="classes"):
        write_sample(tmp_path, classes=0)
    with pytest.raises(FileNotFoundError, match="JPEG"):
        write_sample(tmp_path, classes=1, real_images=tmp_path)

"""Hostile-archive zoo: every unsafe member is refused naming archive + member, and nothing lands outside."""
from __future__ import annotations

import gzip
import io
import json
import logging
import tarfile
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.common import ARCHIVES, PipelineError
from tasks.extract import materialize as imagefolder
from tests.helpers.archives import run_extract, small_release, special, tar_bytes
from tests.helpers.images import fake_jpeg

ESCAPE = f"/tmp/escape-{uuid.uuid4().hex}"  # where an absolute member would land if it were extracted
TRAIN, VAL, DEVKIT = ARCHIVES["train"], ARCHIVES["val"], ARCHIVES["devkit"]


def _truncated(members, keep: int) -> bytes:
    """A tar whose last member declares more bytes than the archive holds (`keep` bytes of its data kept)."""
    data = tar_bytes(members)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        start = tar.getmembers()[-1].offset_data
    return data[:start + keep]


def _add_devkit_link(raw: Path) -> None:
    inner = gzip.decompress((raw / DEVKIT).read_bytes())
    with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    members.append(special("ILSVRC2012_devkit_t12/data/link", tarfile.SYMTYPE, "/etc/passwd"))
    (raw / DEVKIT).write_bytes(gzip.compress(tar_bytes(members), mtime=0))


ZOO = {  # case → (build kwargs for small_release or a callable patching raw/, archive named, member, why)
    "val_absolute": ({"extra_val": [(f"{ESCAPE}/evil.JPEG", b"x")]}, VAL, f"{ESCAPE}/evil.JPEG", "absolute path"),
    "val_dotdot": ({"extra_val": [("../evil.JPEG", b"x")]}, VAL, "../evil.JPEG", r"contains '\.\.'"),
    "val_inner_dotdot": ({"extra_val": [("a/../../evil.JPEG", b"x")]}, VAL, "a/../../evil.JPEG", r"'\.\.'"),
    "val_symlink": ({"extra_val": [special("evil.JPEG", tarfile.SYMTYPE, "/etc/passwd")]}, VAL, "evil.JPEG",
                    "symbolic link"),
    "val_hardlink": ({"extra_val": [special("evil.JPEG", tarfile.LNKTYPE, "/etc/passwd")]}, VAL, "evil.JPEG",
                     "hard link"),
    "val_chardev": ({"extra_val": [special("evil.JPEG", tarfile.CHRTYPE)]}, VAL, "evil.JPEG", "device or FIFO"),
    "val_blockdev": ({"extra_val": [special("evil.JPEG", tarfile.BLKTYPE)]}, VAL, "evil.JPEG", "device or FIFO"),
    "val_fifo": ({"extra_val": [special("evil.JPEG", tarfile.FIFOTYPE)]}, VAL, "evil.JPEG", "device or FIFO"),
    "val_oversize": ("val_oversize", VAL, "ILSVRC2012_val_00000009.JPEG", "declares 40000 bytes"),
    "train_outer_symlink": ({"extra_train": [special("n01484850.tar", tarfile.SYMTYPE, "/etc")]}, TRAIN,
                            "n01484850.tar", "symbolic link"),
    "train_outer_dotdot": ({"extra_train": [("../n01484850.tar", tar_bytes([("a.JPEG", b"x")]))]}, TRAIN,
                           "../n01484850.tar", r"'\.\.'"),
    "train_inner_dotdot": ({"inner_extra": {"n01440764": [("../../evil.JPEG", b"x")]}}, TRAIN,
                           "../../evil.JPEG", r"'\.\.'"),
    "train_inner_absolute": ({"inner_extra": {"n01443537": [(f"{ESCAPE}/evil.JPEG", b"x")]}}, TRAIN,
                             f"{ESCAPE}/evil.JPEG", "absolute path"),
    "train_inner_symlink": ({"inner_extra": {"n01440764": [special("evil.JPEG", tarfile.SYMTYPE, "/etc/passwd")]}},
                            TRAIN, "evil.JPEG", "symbolic link"),
    "train_inner_fifo": ({"inner_extra": {"n01440764": [special("evil.JPEG", tarfile.FIFOTYPE)]}}, TRAIN,
                         "evil.JPEG", "device or FIFO"),
    "train_inner_oversize": ("train_inner_oversize", TRAIN, "big.JPEG", "declares 40000 bytes"),
    "devkit_symlink": ("devkit_symlink", DEVKIT, "ILSVRC2012_devkit_t12/data/link", "symbolic link"),
}


def _build(raw: Path, spec) -> None:
    if isinstance(spec, dict):
        small_release(raw, **spec)
        return
    small_release(raw)
    if spec == "val_oversize":  # the last val image claims 40000 bytes; the file ends after 1000
        names = sorted(n for n in tarfile.open(raw / VAL).getnames())
        members = [(n, fake_jpeg(k)) for k, n in enumerate(names)] + [("ILSVRC2012_val_00000009.JPEG", b"v" * 40000)]
        (raw / VAL).write_bytes(_truncated(members, 1000))
    elif spec == "train_inner_oversize":  # an inner tar cut short, followed by an honest class tar
        inner = _truncated([("ok.JPEG", b"o" * 600), ("big.JPEG", b"b" * 40000)], 700)
        outer = [("n01440764.tar", inner), ("n01443537.tar", tar_bytes([("x.JPEG", b"x" * 50000)]))]
        (raw / TRAIN).write_bytes(tar_bytes(outer))
    elif spec == "devkit_symlink":
        _add_devkit_link(raw)


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("case", sorted(ZOO))
def test_hostile_member_refused_nothing_written(tmp_path, case):
    spec, archive, member, why = ZOO[case]
    raw, out = tmp_path / "raw", tmp_path / "out"
    _build(raw, spec)
    before = _files(tmp_path)
    with pytest.raises(PipelineError, match=why) as err:
        run_extract(raw, out, materialize=True)
    message = str(err.value)
    assert archive in message and repr(member) in message, message
    assert "refused member" in message
    written = _files(tmp_path) - before
    assert all(p == out or out in p.parents for p in written), written  # only staging files under out/
    assert not (out / "manifests").exists() and not (out / "label_map.json").exists()
    assert not (out / "imagefolder").exists() and not Path(ESCAPE).exists()
    assert not list(tmp_path.rglob("evil*")) and not (tmp_path.parent / "evil.JPEG").exists()


def test_strange_names_reported_not_merged(tmp_path, caplog):
    bad_name = b"n01440764_\xff\xfe.JPEG".decode("utf-8", "surrogateescape")
    inner_extra = {"n01440764": [("N01440764_1.JPEG", fake_jpeg(901)), ("n01440764_notes.txt", b"notes"),
                                 (bad_name, fake_jpeg(902))]}
    small_release(tmp_path / "raw", inner_extra=inner_extra, extra_train=[("README.txt", b"hello")],
                  extra_val=[("ILSVRC2012_val_readme.txt", b"hi")])
    with caplog.at_level(logging.WARNING, logger="tasks.extract"):
        report = run_extract(tmp_path / "raw", tmp_path / "out", materialize=True)
    reasons = {(r["split"], r["member"]): (r["reason"], r["action"]) for r in report["reported"]}
    assert reasons[("train", "n01440764.tar/N01440764_1.JPEG | n01440764.tar/n01440764_1.JPEG")] == \
        ("2 names collide after case-folding", "kept all")
    assert reasons[("train", "n01440764.tar/n01440764_\\xff\\xfe.JPEG")][0].startswith("name is not valid UTF-8")
    assert reasons[("train", "n01440764.tar/n01440764_notes.txt")][0].startswith("not an image")
    assert reasons[("train", "README.txt")] == ("not a per-class <wnid>.tar", "skipped")
    assert reasons[("val", "ILSVRC2012_val_readme.txt")][0].startswith("not an image")
    assert "collide after case-folding" in caplog.text and "not valid UTF-8" in caplog.text
    names = [r["name"] for r in pq.read_table(tmp_path / "out/manifests/train.parquet").to_pylist()
             if r["wnid"] == "n01440764"]
    assert names == ["N01440764_1.JPEG", "n01440764_1.JPEG", "n01440764_15.JPEG", "n01440764_8.JPEG"]
    tree = tmp_path / "out/imagefolder/train/n01440764"
    assert sorted(p.name for p in tree.iterdir()) == names  # both spellings written, nothing merged
    saved = json.loads((tmp_path / "out/manifests/extract_report.json").read_text())
    assert saved["reported"] == report["reported"]


def test_exact_duplicate_names_indexed_but_not_materialized(tmp_path):
    small_release(tmp_path / "raw", inner_extra={"n01440764": [("n01440764_1.JPEG", fake_jpeg(77))]})
    report = run_extract(tmp_path / "raw", tmp_path / "out")
    assert report["images"]["train"] == 13
    with pytest.raises(PipelineError, match="used twice.*n01440764/n01440764_1.JPEG"):
        imagefolder.materialize(tmp_path / "out/manifests", tmp_path / "out/imagefolder", root=tmp_path / "out")
    assert not (tmp_path / "out/imagefolder").exists() and not list((tmp_path / "out").glob(".imagefolder*"))

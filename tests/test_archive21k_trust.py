"""Trust nothing, part 2 (issue 28, items 11-13): ImageNet-21k's archive of per-class tars. An empty or duplicated
class tar is reported in extract_report.json (a duplicate's same-named images refused, never one silently kept); a
stale decompressed .tar is removed when download.archive changes; a gzip bomb stops at the free space; a kill -9
or a full disk while decompressing leaves nothing under a final name (nor a temporary file a rerun never removes)."""
from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.common import PipelineError
from tasks.common.archive_pass import hash_and_index
from tasks.extract import stage as extract
from tests.helpers.archives import tar_bytes
from tests.helpers.datasets import small_jpeg

W = [f"n{10_000_000 + 37 * k:08d}" for k in range(4)]


def _images(wnid: str, count: int, first: int = 0) -> list[tuple[str, bytes]]:
    return [(f"{wnid}_{i}.JPEG", small_jpeg(int(wnid[1:]) % 1000 * 10 + i)) for i in range(first, first + count)]


def _scan(tmp_path: Path, inner: list) -> tuple[list[dict], list[dict]]:
    """The archive of `inner` (name, bytes) class tars through the extract stage's index, and through the
    download stage's one-read MD5 + index (the prescan): both must report the same."""
    archive = tmp_path / "raw/w.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(tar_bytes(inner))
    staged = extract.scan_archive_split("train", archive, tmp_path / "staging", tmp_path)
    reported = json.loads(staged.with_name("train.scan.json").read_text())["reported"]
    found = hash_and_index(archive, "train", "raw/w.tar", progress=False)
    assert found.refused is None and found.reported == reported
    return pq.read_table(staged).to_pylist(), reported


# ---------------------------------------------------------------- item 11: empty and duplicate class tars
@pytest.mark.parametrize("empty", [
    [],  # no member at all
    [("readme.txt", b"hi")],  # no image: the file is reported, and so is the class
    [tarfile.TarInfo("sub")],  # a directory only
])
def test_an_empty_class_tar_is_reported_as_an_absent_class(tmp_path, empty):
    if empty and isinstance(empty[0], tarfile.TarInfo):
        empty[0].type = tarfile.DIRTYPE
    rows, reported = _scan(tmp_path, [(f"{W[0]}.tar", tar_bytes(_images(W[0], 2))), (f"{W[1]}.tar", tar_bytes(empty))])
    assert {r["wnid"] for r in rows} == {W[0]}
    entry = {"split": "train", "source": "raw/w.tar", "member": f"{W[1]}.tar", "reason": "empty class tar (no images)",
             "action": f"class {W[1]} counts as absent from train"}
    assert entry in reported


def test_a_duplicate_class_tar_is_a_reported_merge(tmp_path):
    first, second = _images(W[0], 2), _images(W[0], 3, first=2)
    rows, reported = _scan(tmp_path, [(f"{W[0]}.tar", tar_bytes(first)), (f"{W[1]}.tar", tar_bytes(_images(W[1], 1))),
                                      (f"{W[0]}.tar", tar_bytes(second))])
    assert sorted(r["name"] for r in rows if r["wnid"] == W[0]) == sorted(n for n, _ in first + second)
    dup = [r for r in reported if W[0] in r["reason"]]
    assert dup == [{"split": "train", "source": "raw/w.tar", "member": f"{W[0]}.tar | {W[0]}.tar",
                    "reason": f"class {W[0]} in 2 class tars (a duplicate <wnid>.tar)",
                    "action": "merged: the 5 images of all 2 kept (no name in two of them)"}]
    assert not any("collide" in r["reason"] for r in reported)  # not misreported as a case-folding collision


def test_the_same_class_in_two_folders_and_an_empty_copy_are_reported(tmp_path):
    rows, reported = _scan(tmp_path, [(f"a/{W[2]}.tar", tar_bytes(_images(W[2], 2))), (f"b/{W[2]}.tar", tar_bytes([]))])
    assert len(rows) == 2
    reasons = {r["member"]: (r["reason"], r["action"]) for r in reported}
    assert reasons[f"b/{W[2]}.tar"] == ("empty class tar (no images)", f"no image of class {W[2]} from this copy")
    assert reasons[f"a/{W[2]}.tar | b/{W[2]}.tar"][0] == f"class {W[2]} in 2 class tars (a duplicate <wnid>.tar)"


@pytest.mark.parametrize("second", [
    lambda: _images(W[0], 2),  # the very same tar twice
    lambda: _images(W[0], 1, first=1) + [(f"{W[0]}_9.JPEG", small_jpeg(5))],  # one name in both, other bytes
])
def test_a_duplicate_class_tar_with_a_name_in_both_copies_is_refused_never_one_kept(tmp_path, second):
    archive = tmp_path / "raw/w.tar"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(tar_bytes([(f"{W[0]}.tar", tar_bytes(_images(W[0], 2))), (f"{W[0]}.tar", tar_bytes(second()))]))
    with pytest.raises(PipelineError) as err:
        extract.scan_archive_split("train", archive, tmp_path / "staging", tmp_path)
    message = str(err.value)
    assert f"{archive}: expected each image of class {W[0]} once, found {W[0]}_" in message
    assert f".JPEG in 2 copies of {W[0]}.tar" in message and "keep one copy of the class tar" in message
    assert not (tmp_path / "staging/train.parquet").exists()
    assert hash_and_index(archive, "train", "", progress=False).refused == message

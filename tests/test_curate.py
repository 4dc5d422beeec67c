"""Curation as data (issue 12): the exclude list and relabel table applied by the extract stage, counted, checked
line by line (an unknown image, wnid, split or a malformed line fails naming the file and line)."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.common import PipelineError
from tasks.extract import curate
from tasks.extract import stage as extract
from tests.helpers.params import project
from tests.test_extract import make_tree, run_folder

A, B, C = "n01440764", "n01443537", "n01484850"
EXCLUDE = "split,wnid,name,reason\n"
RELABEL = "split,wnid,name,new_wnid,reason\n"


def _tree(root: Path) -> Path:
    tree = root / "tree"
    make_tree(tree, {"train": {A: ["a1.JPEG", "a2.JPEG", "a3.JPEG"], B: ["b1.JPEG", "b2.JPEG"], C: ["c1.JPEG"]},
                     "val": {A: ["va.JPEG"], B: ["vb.JPEG", "vb2.JPEG"], C: ["vc.JPEG"]}})
    return tree


def _files(root: Path, exclude: str = "", relabel: str = "") -> curate.Curation:
    (root / "exclude.csv").write_text(EXCLUDE + exclude)
    (root / "relabel.csv").write_text(RELABEL + relabel)
    return curate.read_curation(root / "exclude.csv", root / "relabel.csv")


def test_exclude_and_relabel_are_applied_and_counted_by_reason_and_class(tmp_path):
    curation = _files(tmp_path, f"train,{A},a2.JPEG,near-duplicate of val\nval,{B},vb2.JPEG,blurry\n"
                                f"train,{A},a3.JPEG,near-duplicate of val\n",
                      f"train,{B},b2.JPEG,{C},wrong label\n")
    report = run_folder(_tree(tmp_path), tmp_path / "out", curation=curation)
    train = pq.read_table(tmp_path / "out/manifests/train.parquet").to_pylist()
    assert [(r["wnid"], r["name"]) for r in train] == [(A, "a1.JPEG"), (B, "b1.JPEG"), (C, "b2.JPEG"), (C, "c1.JPEG")]
    assert [r["label"] for r in train] == [0, 1, 2, 2]  # label ids fixed: the class set did not change
    val = pq.read_table(tmp_path / "out/manifests/val.parquet").column("name").to_pylist()
    assert val == ["va.JPEG", "vb.JPEG", "vc.JPEG"]
    cur = report["curation"]
    assert cur["exclude"]["train"] == {"lines": 2, "by_reason": {"near-duplicate of val": 2}, "by_class": {A: 2}}
    assert cur["exclude"]["val"] == {"lines": 1, "by_reason": {"blurry": 1}, "by_class": {B: 1}}
    assert cur["relabel"]["train"] == {"lines": 1, "by_reason": {"wrong label": 1}, "by_class": {f"{B}->{C}": 1}}
    assert cur["relabel"]["val"]["lines"] == 0 and report["images"] == {"train": 4, "val": 3}
    again = run_folder(_tree(tmp_path / "again"), tmp_path / "out2", curation=curation)  # deterministic
    assert again["curation"] == cur
    assert (tmp_path / "out/manifests/train.parquet").read_bytes() != b""


@pytest.mark.parametrize("exclude, relabel, message", [
    (f"train,{A},zz.JPEG,gone\n", "", r"exclude.csv:2: expected an image zz.JPEG of class n01440764 in train"),
    (f"train,{B},a1.JPEG,gone\n", "", r"exclude.csv:2: expected an image a1.JPEG of class n01443537"),
    ("", f"train,{A},a1.JPEG,n09999999,x\n", r"relabel.csv:2: expected new_wnid an ILSVRC2012 wnid"),
    ("", f"val,{A},va.JPEG,{A},x\n", r"relabel.csv:2: expected new_wnid other than wnid"),
    (f"\ntest,{A},a1.JPEG,x\n", "", r"exclude.csv:3: expected split one of train, val, found 'test'"),
    (f"train,{A},a1.JPEG\n", "", r"exclude.csv:2: expected 4 fields"),
    (f"train,{A},a1.JPEG,\n", "", r"exclude.csv:2: expected a name and a reason"),
    (f"train,{A},a1.JPEG,x\n", f"train,{A},a1.JPEG,{B},y\n", r"relabel.csv:2: expected each image once .*exclude.csv:2"),
])
def test_a_bad_line_fails_naming_the_file_and_line_and_writes_nothing(tmp_path, exclude, relabel, message):
    with pytest.raises(PipelineError, match=message):
        curation = _files(tmp_path, exclude, relabel)
        run_folder(_tree(tmp_path), tmp_path / "out", curation=curation)
    assert not (tmp_path / "out/manifests").exists()


def test_header_and_missing_file_and_params_section(tmp_path):
    (tmp_path / "exclude.csv").write_text("wnid,name\n")
    with pytest.raises(PipelineError, match=r"exclude.csv:1: expected the header split,wnid,name,reason"):
        curate.read_curation(tmp_path / "exclude.csv", None)
    setup = project(tmp_path, curate={"exclude": "curation/exclude.csv", "relabel": None})
    with pytest.raises(PipelineError, match=r"curate.exclude: expected a CSV .*curation/exclude.csv \(no such file\)"):
        extract.job_from_params(setup)  # before any scan
    (tmp_path / "curation").mkdir()
    (tmp_path / "curation/exclude.csv").write_text(EXCLUDE + f"val,{C},vc.JPEG,dup\n")
    job = extract.job_from_params(setup)
    assert job.curation.exclude[0].where == f"{tmp_path}/curation/exclude.csv:2" and not job.curation.relabel
    assert job.curation.files == {"exclude": "curation/exclude.csv", "relabel": None}  # as given: no checkout path

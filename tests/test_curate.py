"""Curation as data (issue 12, merge-on-read since issue 27): the exclude list and relabel table applied by the
curate stage as the overlay beside the shards — the manifests and shards keep every image with its label as
converted —, counted by reason and class in curation.json, checked line by line (an unknown image, class, split or
a malformed line fails naming the file and line, and writes no overlay).

Also the helpers other tests curate through: `write_converted` (the convert stage's output for manifests whose
"images" are not all images, written directly), `curate_out` (that, then the curate stage) and `overlaid`."""
from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset
from imagenet_parquet.format import class_ids, class_names, shard_schema
from imagenet_parquet.overlay import read_overlay
from tasks.common import SPLITS, PipelineError
from tasks.convert.distribute import run_local
from tasks.convert.job import job_from_params as convert_job
from tasks.curate import lines as curate
from tasks.curate import stage
from tests.helpers.datasets import contract_row, small_jpeg
from tests.helpers.params import project
from tests.test_extract import run_folder

A, B, C = "n01440764", "n01443537", "n01484850"
EXCLUDE = "split,wnid,name,reason\n"
RELABEL = "split,wnid,name,new_wnid,reason\n"
CURATE = {"exclude": "curation/exclude.csv", "relabel": "curation/relabel.csv"}
LAYOUT = {"train": {A: ["a1.JPEG", "a2.JPEG", "a3.JPEG"], B: ["b1.JPEG", "b2.JPEG"], C: ["c1.JPEG"]},
          "val": {A: ["va.JPEG"], B: ["vb.JPEG", "vb2.JPEG"], C: ["vc.JPEG"]}}


# ---------------------------------------------------------------- helpers (used by other test modules too)
def write_converted(manifests: Path, label_map: Path, parquet: Path, root: Path) -> None:
    """What the curate stage reads of the convert stage's output, for manifests whose files need not be images
    (tests.test_extract.make_tree's): per split one shard of every manifest row in manifest order, the bytes read
    from the sources (relative to `root`), labels as extracted, metadata `curation: overlay`."""
    lmap = json.loads(label_map.read_text(encoding="utf-8"))
    names = class_names(lmap)
    for split in SPLITS:
        rows = []
        for r in pq.read_table(manifests / f"{split}.parquet").to_pylist():
            with open(root / r["source"], "rb") as fh:
                fh.seek(r["offset"])
                data = fh.read(r["size"])
            rows.append(_row(data, r["name"], r["label"], lmap["classes"][r["label"]].get("wnid"), names[r["label"]]))
        schema = shard_schema(lmap, {"policy": "passthrough"}, split, curation="overlay")
        (parquet / split).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet / split / f"{split}-00000-of-00001.parquet")


def _row(data: bytes, name: str, label: int, wnid: str | None, label_name: str) -> dict[str, Any]:
    """contract_row, also for bytes that only start like an image (a truncated JPEG: 1x1, no fingerprint)."""
    try:
        return contract_row(data, name, label, wnid, label_name)
    except OSError:
        row = contract_row(b"", name, label, wnid, label_name)
        return {**row, "image": {"bytes": data, "path": name}, "sha256": hashlib.sha256(data).hexdigest()}


def read_lines(root: Path, exclude: str = "", relabel: str = "", bom: str = "") -> curate.Curation:
    """exclude.csv and relabel.csv under `root` (headers, then these lines), read as the curate stage reads them."""
    (root / "exclude.csv").write_text(bom + EXCLUDE + exclude, encoding="utf-8")
    (root / "relabel.csv").write_text(bom + RELABEL + relabel, encoding="utf-8")
    return curate.read_curation(root / "exclude.csv", root / "relabel.csv")


def curate_out(out: Path, curation: curate.Curation, root: Path | None = None) -> dict[str, Any]:
    """run_folder's / run_extract's output `out` converted (write_converted, sources relative to `root`, default
    `out`), then the curate stage: the overlays and curation.json in `out/overlay`; returns curation.json."""
    write_converted(out / "manifests", out / "label_map.json", out / "parquet", root or out)
    job = stage.CurateJob(out / "parquet", out / "manifests", out / "label_map.json", out / "overlay", curation)
    return stage.write_overlays(job)


def overlaid(parquet: Path, label_map: Path, split: str) -> list[tuple[str, str]]:
    """(class now, image name) of every row the overlay beside `parquet` keeps, in shard order."""
    _, table = read_overlay(parquet.parent / "overlay" / f"{split}.parquet")
    files = sorted((parquet / split).glob("*.parquet"))
    names = [n for f in files for n in pq.ParquetFile(f).read(columns=["image.path"]).column("image")
             .combine_chunks().field("path").to_pylist()]
    ids = class_ids(json.loads(label_map.read_text(encoding="utf-8")))
    rows = zip(names, table.column("label").to_pylist(), table.column("keep").to_pylist(), strict=True)
    return [(ids[label], name) for name, label, keep in rows if keep]


# ---------------------------------------------------------------- end to end: extract -> convert -> curate
@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A folder-mode project (small JPEGs) extracted and converted by the stages: data/manifests, data/parquet."""
    root = tmp_path_factory.mktemp("curate")
    seed = 0
    for split, classes in LAYOUT.items():
        for wnid, files in classes.items():
            (root / "tree" / split / wnid).mkdir(parents=True)
            for name in files:
                seed += 1
                (root / "tree" / split / wnid / name).write_bytes(small_jpeg(seed))
    run_folder(root / "tree", root / "data")  # manifests + label map where params.yaml's paths put them
    paths = project(root).paths
    run_local(convert_job(project(root).params.convert, paths, root=root / "data"), progress=False)
    return root


def _copy(converted: Path, root: Path, exclude: str = "", relabel: str = ""):
    """The converted project copied to `root` with these curation lines; its curate job (the lines read)."""
    shutil.copytree(converted / "data", root / "data", ignore=shutil.ignore_patterns("overlay"))
    (root / "curation").mkdir()
    (root / "curation/exclude.csv").write_text(EXCLUDE + exclude, encoding="utf-8")
    (root / "curation/relabel.csv").write_text(RELABEL + relabel, encoding="utf-8")
    return stage.job_from_params(project(root, curate=CURATE))


def test_the_overlay_applies_the_lines_counted_by_reason_and_class_while_manifests_keep_every_image(
        converted, tmp_path):
    job = _copy(converted, tmp_path, f"train,{A},a2.JPEG,near-duplicate of val\nval,{B},vb2.JPEG,blurry\n"
                                     f"train,{A},a3.JPEG,near-duplicate of val\n",
                f"train,{B},b2.JPEG,{C},wrong label\n")
    report = stage.write_overlays(job)
    train = pq.read_table(job.manifests / "train.parquet").to_pylist()  # as extracted: uncurated
    assert [(r["wnid"], r["name"], r["label"]) for r in train] == [
        (A, "a1.JPEG", 0), (A, "a2.JPEG", 0), (A, "a3.JPEG", 0), (B, "b1.JPEG", 1), (B, "b2.JPEG", 1),
        (C, "c1.JPEG", 2)]
    assert len(pq.read_table(job.manifests / "val.parquet")) == 4
    assert sum(pq.read_metadata(f).num_rows for f in (job.parquet / "train").glob("*.parquet")) == 6
    assert sorted(overlaid(job.parquet, job.label_map, "train")) == [
        (A, "a1.JPEG"), (B, "b1.JPEG"), (C, "b2.JPEG"), (C, "c1.JPEG")]  # label ids fixed: same class set
    assert sorted(n for _, n in overlaid(job.parquet, job.label_map, "val")) == ["va.JPEG", "vb.JPEG", "vc.JPEG"]
    dataset = ParquetImageDataset(job.parquet, "train", decode=False)  # readers apply it
    assert len(dataset) == 4 and Counter(dataset.targets.tolist()) == {0: 1, 1: 1, 2: 2}
    assert report["exclude"]["train"] == {"lines": 2, "by_reason": {"near-duplicate of val": 2}, "by_class": {A: 2}}
    assert report["exclude"]["val"] == {"lines": 1, "by_reason": {"blurry": 1}, "by_class": {B: 1}}
    assert report["relabel"]["train"] == {"lines": 1, "by_reason": {"wrong label": 1}, "by_class": {f"{B}->{C}": 1}}
    assert report["relabel"]["val"]["lines"] == 0 and report["not_in_shards"] == []
    assert report["files"] == CURATE and json.loads((job.overlay / "curation.json").read_text()) == report
    written = {p.name: p.read_bytes() for p in job.overlay.iterdir()}
    assert stage.write_overlays(job) == report  # deterministic: the same bytes again
    assert {p.name: p.read_bytes() for p in job.overlay.iterdir()} == written


@pytest.mark.parametrize("exclude, relabel, message", [
    (f"train,{A},zz.JPEG,gone\n", "", r"exclude.csv:2: expected an image zz.JPEG of class n01440764 in train, found "
                                      r"no such image in the source; fix the curation file"),
    (f"train,{B},a1.JPEG,gone\n", "", r"exclude.csv:2: expected an image a1.JPEG of class n01443537"),
    ("", f"train,{A},a1.JPEG,n09999999,x\n", r"relabel.csv:2: expected new_wnid a class of the dataset .*n09999999"),
    ("", f"val,{A},va.JPEG,{A},x\n", r"relabel.csv:2: expected new_wnid other than wnid"),
    (f"\ntest,{A},a1.JPEG,x\n", "", r"exclude.csv:3: expected split one of train, val, found 'test'"),
    (f"train,{A},a1.JPEG\n", "", r"exclude.csv:2: expected 4 fields"),
    (f"train,{A},a1.JPEG,\n", "", r"exclude.csv:2: expected a name and a reason"),
    (f"train,{A},a1.JPEG,x\n", f"train,{A},a1.JPEG,{B},y\n", r"relabel.csv:2: expected each image once .*exclude.csv:2"),
    (f"val,{C},vc.JPEG,blurry\n", "", rf"exclude.csv:2: expected class {C} left with images in val"),
])
def test_a_bad_line_fails_naming_the_file_and_line_and_writes_nothing(converted, tmp_path, exclude, relabel, message):
    with pytest.raises(PipelineError, match=message) as err:
        stage.write_overlays(_copy(converted, tmp_path, exclude, relabel))
    assert str(err.value).startswith(f"{tmp_path}/curation/")
    assert not (tmp_path / "data/overlay").exists()


def test_header_and_missing_file_and_params_section(tmp_path):
    (tmp_path / "exclude.csv").write_text("wnid,name\n")
    with pytest.raises(PipelineError, match=r"exclude.csv:1: expected the header split,wnid,name,reason"):
        curate.read_curation(tmp_path / "exclude.csv", None)
    setup = project(tmp_path, curate={"exclude": "curation/exclude.csv", "relabel": None})
    with pytest.raises(PipelineError, match=r"curate.exclude: expected a CSV .*curation/exclude.csv \(no such file\)"):
        stage.job_from_params(setup)  # before any shard is read
    (tmp_path / "curation").mkdir()
    (tmp_path / "curation/exclude.csv").write_text(EXCLUDE + f"val,{C},vc.JPEG,dup\n")
    job = stage.job_from_params(setup)
    assert job.curation.exclude[0].where == f"{tmp_path}/curation/exclude.csv:2" and not job.curation.relabel
    assert job.curation.files == {"exclude": "curation/exclude.csv", "relabel": None}  # as given: no checkout path


def test_a_line_naming_an_image_convert_quarantined_applies_nothing_and_is_reported(tmp_path):
    from tests.test_extract import make_tree

    make_tree(tmp_path / "tree", LAYOUT)
    run_folder(tmp_path / "tree", tmp_path / "out")
    out = tmp_path / "out"
    write_converted(out / "manifests", out / "label_map.json", out / "parquet", out)
    shard = tmp_path / "out/parquet/train/train-00000-of-00001.parquet"
    table = pq.read_table(shard)  # a2.JPEG quarantined: in the manifest, not in the shards
    pq.write_table(table.filter(pa.compute.not_equal(table.column("image").combine_chunks().field("path"),
                                                     "a2.JPEG")), shard)
    job = stage.CurateJob(tmp_path / "out/parquet", tmp_path / "out/manifests", tmp_path / "out/label_map.json",
                          tmp_path / "out/overlay", read_lines(tmp_path, f"train,{A},a2.JPEG,dup\n"))
    report = stage.write_overlays(job)
    assert report["not_in_shards"] == [{"where": f"{tmp_path}/exclude.csv:2", "split": "train", "wnid": A,
                                        "name": "a2.JPEG"}]
    assert len(overlaid(job.parquet, job.label_map, "train")) == 5


# ---------------------------------------------------------------- issue 36: paths, exact names, bad bytes
def _quarantine(parquet: Path, name: str) -> None:
    """`name` dropped from the train shards, as convert's quarantine leaves it (in the manifest only)."""
    for shard in sorted((parquet / "train").glob("*.parquet")):
        table = pq.read_table(shard)
        pq.write_table(table.filter(pa.compute.not_equal(table.column("image").combine_chunks().field("path"), name)),
                       shard)


def test_the_overlay_is_byte_identical_from_two_checkouts_at_other_paths(converted, tmp_path):
    """curation.json names the curation file as params.yaml does (relative), also for a line naming an image
    convert quarantined: two copies of one project write the same bytes (the overlay's md5, dvc.lock)."""
    lines = (f"train,{A},a2.JPEG,dup\nval,{B},vb2.JPEG,blurry\n", f"train,{B},b2.JPEG,{C},wrong\n")
    written = []
    for copy in ("one", "elsewhere/two"):
        job = _copy(converted, tmp_path / copy, *lines)
        _quarantine(job.parquet, "a2.JPEG")
        report = stage.write_overlays(job)
        assert report["not_in_shards"] == [{"where": "curation/exclude.csv:2", "split": "train", "wnid": A,
                                            "name": "a2.JPEG"}]
        written.append({p.name: p.read_bytes() for p in sorted(job.overlay.iterdir())})
    assert written[0] == written[1] and b"one" not in written[0]["curation.json"]


def test_class_names_are_compared_exactly_a_space_is_another_class(tmp_path):
    """ImageFolder keeps `cat` and `cat ` apart, so does the label map: a relabel into `cat ` lands in `cat `;
    a line naming a class the dataset lacks (`cat  `, ` cat`) is refused naming its line, never stripped."""
    from tests.test_extract import make_tree

    layout = {split: {"cat": [f"{split}1.jpg", f"{split}2.jpg"], "cat ": [f"{split}3.jpg"],
                     "dog": [f"{split}4.jpg", f"{split}5.jpg"]}
              for split in SPLITS}
    make_tree(tmp_path / "tree", layout)
    run_folder(tmp_path / "tree", tmp_path / "out")
    report = curate_out(tmp_path / "out", read_lines(tmp_path, relabel="train,dog,train4.jpg,cat ,wrong\n"))
    assert report["relabel"]["train"]["by_class"] == {"dog->cat ": 1}
    rows = overlaid(tmp_path / "out/parquet", tmp_path / "out/label_map.json", "train")
    assert ("cat ", "train4.jpg") in rows and ("cat", "train4.jpg") not in rows
    shutil.rmtree(tmp_path / "out/overlay")
    for exclude, relabel, found in [("", "train,dog,train4.jpg,cat  ,wrong\n", "new_wnid a class of the dataset"),
                                    (" train,cat,train1.jpg,x\n", "", "split one of train, val, found ' train'"),
                                    ("train, cat,train1.jpg,x\n", "", "wnid a class of the dataset"),
                                    ("train,cat,train1.jpg ,x\n", "", "an image train1.jpg  of class cat in train")]:
        with pytest.raises(PipelineError) as err:
            curate_out(tmp_path / "out", read_lines(tmp_path, exclude, relabel))
        message = str(err.value)
        assert message.startswith(f"{tmp_path}/{'relabel' if relabel else 'exclude'}.csv:2: expected {found}"), message
        assert not (tmp_path / "out/overlay").exists()


@pytest.mark.parametrize("data, line, found", [
    (EXCLUDE.encode() + f"train,{A},a1.JPEG,ok\n".encode() + b"train,n01443537,b\xe9.JPEG,latin-1\n", 3,
     r"found the bytes b'\\xe9' \(not UTF-8\)"),
    (b"split,wnid,name,re\xffson\n", 1, r"found the bytes b'\\xff' \(not UTF-8\)"),
    (EXCLUDE.encode() + b"\n,,,\n", 3, r"expected a line split,wnid,name,reason, found ',,,', only empty fields"),
    (EXCLUDE.encode() + b",,\n", 2, r"expected 4 fields"),
    (EXCLUDE.encode() + f"train,{A},a1.JPEG,  \n".encode(), 2, r"expected a name and a reason"),
])
def test_bad_bytes_and_empty_lines_fail_naming_the_file_and_line(tmp_path, data, line, found):
    (tmp_path / "exclude.csv").write_bytes(data)
    with pytest.raises(PipelineError, match=found) as err:
        curate.read_curation(tmp_path / "exclude.csv", None)
    assert str(err.value).startswith(f"{tmp_path}/exclude.csv:{line}: expected ") and "\n" not in str(err.value)


def test_a_curation_file_linking_out_of_curation_is_refused_naming_the_key(tmp_path):
    (tmp_path / "curation").mkdir()
    (tmp_path / "outside-exclude.csv").write_text(EXCLUDE)
    (tmp_path / "curation/exclude.csv").symlink_to(tmp_path / "outside-exclude.csv")
    with pytest.raises(PipelineError, match=r"^params.yaml curate.exclude: expected a file inside curation/ .*, found "
                                            r"curation/exclude.csv linking to .*outside-exclude.csv; copy the file"):
        stage.job_from_params(project(tmp_path, curate={"exclude": "curation/exclude.csv", "relabel": None}))
    (tmp_path / "curation/exclude.csv").unlink()
    (tmp_path / "curation/exclude.csv").write_text(EXCLUDE)
    assert stage.job_from_params(project(tmp_path, curate={"exclude": "curation/exclude.csv", "relabel": None}))


def _killed_mid_write(job: stage.CurateJob) -> int:
    """write_overlays in a forked child that is killed -9 halfway through writing the val overlay; its exit code."""
    import multiprocessing
    import os
    import signal

    def child() -> None:
        real = stage.write_overlay

        def half_then_die(table: pa.Table, path: Path) -> None:
            real(table, path)
            if "val" in path.name:
                data = path.read_bytes()
                path.write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)

        stage.write_overlay = half_then_die  # the child's module only
        stage.write_overlays(job)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(120)
    return int(process.exitcode or 0)


def test_a_kill_during_the_overlay_write_leaves_the_previous_overlay_whole_and_a_rerun_the_same_bytes(
        converted, tmp_path):
    """The overlay is one version: a kill -9 while val.parquet is half written leaves the previous train, val and
    curation.json (never a new train beside an old val, nor a half file under a final name); the rerun writes the
    bytes a run never interrupted writes, and leaves no temporary behind."""
    old = _copy(converted, tmp_path / "project", f"train,{A},a2.JPEG,dup\n")
    stage.write_overlays(old)
    before = {p.name: p.read_bytes() for p in sorted(old.overlay.iterdir())}
    new_lines = (f"val,{B},vb2.JPEG,blurry\n", f"train,{B},b2.JPEG,{C},wrong\n")
    for name, text in zip(("exclude.csv", "relabel.csv"), (EXCLUDE, RELABEL), strict=True):
        (tmp_path / "project/curation" / name).write_text(text + new_lines[name == "relabel.csv"])
    job = stage.job_from_params(project(tmp_path / "project", curate=CURATE))
    assert _killed_mid_write(job) == -9
    assert [p.name for p in job.overlay.parent.iterdir() if ".tmp-" in p.name]  # the killed run's, not published
    assert {p.name: p.read_bytes() for p in sorted(job.overlay.iterdir())} == before
    stage.write_overlays(job)
    clean = _copy(converted, tmp_path / "clean", *new_lines)
    stage.write_overlays(clean)
    assert {p.name: p.read_bytes() for p in sorted(job.overlay.iterdir())} == {
        p.name: p.read_bytes() for p in sorted(clean.overlay.iterdir())}
    assert not [p.name for p in job.overlay.parent.iterdir() if ".tmp-" in p.name]

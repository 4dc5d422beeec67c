"""Compaction (issue 27): the curate stage's overlay folded into shards (tasks/curate/compact.py). The compacted
shards read without an overlay give exactly the images and labels the overlay-applied shards give, pandas sees the
curated labels, a shard left empty is dropped, a second compaction writes the same bytes; a missing or stale
overlay and an output outside the project are refused naming what to do."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset
from imagenet_parquet.format import decode_image_index, own_metadata, read_indexed
from tasks.common import PipelineError
from tasks.curate import compact
from tasks.curate import stage as curate
from tests.helpers.datasets import numbered_label_map, write_shards
from tests.helpers.params import project, write_params

WNIDS = [c["wnid"] for c in numbered_label_map(3)["classes"]]
CURATE = {"exclude": "curation/exclude.csv", "relabel": "curation/relabel.csv"}


def _name(i: int, total: int = 48) -> str:
    """write_shards' image name of row i (labels i * 3 // total)."""
    return f"{WNIDS[i * 3 // total]}_{i:05d}.JPEG"


def _project(root: Path) -> Path:
    """data/parquet: train 48 rows in 4 shards (shard 0 all class 0), val 12 rows in 2; the curation lines empty
    train shard 0, exclude two more, relabel three; the curate stage's overlay in data/overlay."""
    write_shards(root / "data/parquet", "train", classes=3, total=48, shards=4)
    write_shards(root / "data/parquet", "val", classes=3, total=12, shards=2)
    shutil.move(root / "data/parquet/label_map.json", root / "data/label_map.json")
    (root / "curation").mkdir()
    excluded = [("train", i, 48) for i in [*range(12), 30]] + [("val", 5, 12)]
    (root / "curation/exclude.csv").write_text("split,wnid,name,reason\n" + "".join(
        f"{s},{WNIDS[i * 3 // n]},{_name(i, n)},dup\n" for s, i, n in excluded))
    moved = [("train", 20, 48, 2), ("train", 40, 48, 0), ("val", 0, 12, 1)]
    (root / "curation/relabel.csv").write_text("split,wnid,name,new_wnid,reason\n" + "".join(
        f"{s},{WNIDS[i * 3 // n]},{_name(i, n)},{WNIDS[to]},wrong\n" for s, i, n, to in moved))
    curate.write_overlays(curate.job_from_params(project(root, curate=CURATE)))
    return root


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    root = _project(tmp_path_factory.mktemp("compact"))
    started = time.perf_counter()
    report = compact.compact(compact.job_from_params(project(root, curate=CURATE)))
    seconds = time.perf_counter() - started
    print(f"\ncompaction: {seconds / 60 * 1e3:.2f} ms per image ({seconds:.3f} s for 60 rows)")
    return root, report


def _items(dataset: ParquetImageDataset) -> list[tuple[bytes, int]]:
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("split", ["train", "val"])
def test_compacted_shards_read_without_overlay_as_the_overlay_applied_shards(compacted, split):
    root, _ = compacted
    merged = ParquetImageDataset(root / "data/parquet", split, decode=False)
    assert merged.overlay is not None and len(merged) == {"train": 35, "val": 11}[split]
    for overlay in ("auto", False):  # auto: data/overlay beside data/compacted is not theirs, and is not applied
        plain = ParquetImageDataset(root / "data/compacted", split, decode=False, overlay=overlay)
        assert plain.overlay is None
        assert _items(plain) == _items(merged)
        assert list(plain.targets) == list(merged.targets)


def test_pandas_reads_the_curated_labels_and_names(compacted):
    root, report = compacted
    names = sorted(p.name for p in (root / "data/compacted/train").iterdir())
    assert names == [f"train-0000{k}-of-00004.parquet" for k in (1, 2, 3)]  # shard 0 emptied: dropped
    assert report["splits"]["train"]["dropped_shards"] == ["train-00000-of-00004.parquet"]
    frame = pq.read_table(root / "data/compacted/train").to_pandas()
    paths = frame["image"].map(lambda image: image["path"]).tolist()
    assert paths == [_name(i) for i in range(12, 48) if i != 30]  # row order kept
    expected = {_name(20): 2, _name(40): 0}
    labels = [expected.get(p, int(p[1:9]) - 10000000) for p in paths]
    assert frame["label"].tolist() == labels
    assert frame["wnid"].tolist() == [WNIDS[k] for k in labels]
    assert frame["label_name"].tolist() == [f"class {k}" for k in labels]
    val = pq.read_table(root / "data/compacted/val").to_pandas()
    assert val["label"].tolist()[:1] == [1] and len(val) == 11


def test_metadata_says_applied_and_the_byte_index_is_rewritten(compacted):
    root, report = compacted
    for path in sorted((root / "data/compacted").rglob("*.parquet")):
        meta = pq.read_metadata(path)
        assert own_metadata(meta.metadata)["curation"] == "applied"
        index = decode_image_index(meta.metadata, meta.num_rows, path)
        images = pq.read_table(path, columns=["image"]).column("image").combine_chunks().field("bytes").to_pylist()
        with open(path, "rb") as fh:
            assert [read_indexed(fh.fileno(), entry, path) for entry in index] == images
    assert json.loads((root / "data/compacted/compaction.json").read_text()) == report
    assert report["splits"]["train"]["relabelled"] == 2 and report["splits"]["train"]["excluded"] == 13


def test_a_second_compaction_writes_the_same_bytes(compacted):
    root, _ = compacted
    again = compact.job_from_params(project(root, curate=CURATE), "data/again")
    compact.compact(again)
    first = {p.relative_to(root / "data/compacted"): p.read_bytes() for p in (root / "data/compacted").rglob("*.*")}
    second = {p.relative_to(again.out): p.read_bytes() for p in again.out.rglob("*.*")}
    assert first == second and len(first) == 7  # 3 train + 2 val shards + compaction.json + .compaction
    compact.compact(compact.job_from_params(project(root, curate=CURATE)))  # in place: the split dirs replaced
    assert {p.relative_to(root / "data/compacted"): p.read_bytes()
            for p in (root / "data/compacted").rglob("*.*")} == first


def test_the_cli_compacts_from_params_yaml(compacted, capsys):
    root, _ = compacted
    write_params(root, curate=CURATE)
    assert compact.main(["--params", str(root / "params.yaml"), "--out", "data/cli"]) == 0
    assert "train: 35 of 48 rows in 3 shards" in capsys.readouterr().out
    assert (root / "data/cli/val/val-00001-of-00002.parquet").read_bytes() == \
        (root / "data/compacted/val/val-00001-of-00002.parquet").read_bytes()
    assert compact.main(["--params", str(root / "params.yaml"), "--out", "/tmp"]) == 1
    assert "expected a directory inside the project" in capsys.readouterr().err


@pytest.mark.parametrize("out, message", [
    ("/tmp/elsewhere", r"compact --out: expected a directory inside the project .* found /tmp/elsewhere"),
    ("..", r"compact --out: expected a directory inside the project"),
    (".", r"compact --out: expected a directory inside the project"),
    ("data/parquet/x", r"expected a directory apart from .*data/parquet \(params.yaml paths.parquet"),
    ("data", r"expected a directory apart from .*data/parquet"),
    ("data/overlay", r"expected a directory apart from .*data/overlay \(params.yaml paths.overlay"),
])
def test_an_output_outside_the_project_or_over_the_inputs_is_refused(tmp_path, out, message):
    with pytest.raises(PipelineError, match=message):
        compact.job_from_params(project(tmp_path), out)


def test_a_missing_overlay_is_refused_naming_it_before_anything_is_written(tmp_path):
    root = _project(tmp_path)
    (root / "data/overlay/val.parquet").unlink()
    with pytest.raises(PipelineError, match=r"data/overlay/val.parquet: expected the curation overlay of the val "
                                            r"shards in .*, found no file; run `dvc repro curate`"):
        compact.compact(compact.job_from_params(project(root, curate=CURATE)))
    assert not (root / "data/compacted").exists()  # train's overlay was there: still nothing written


def test_a_stale_overlay_is_refused_naming_the_shard(tmp_path):
    root = _project(tmp_path)
    write_shards(root / "data/parquet", "train", classes=3, total=48, shards=4, noise_px=16)  # shards re-made
    with pytest.raises(PipelineError, match=r"data/overlay/train.parquet: expected shard train-00000-of-00004.parquet "
                                            r"with 12 rows and footer sha256 .* \(compaction needs the overlay made"):
        compact.compact(compact.job_from_params(project(root, curate=CURATE)))


def test_compacted_shards_are_not_compacted_again(compacted, tmp_path):
    root, _ = compacted
    other = tmp_path / "p"
    shutil.copytree(root / "data/compacted", other / "data/parquet")
    shutil.copytree(root / "data/overlay", other / "data/overlay")
    with pytest.raises(PipelineError, match=r"expected shards as the convert stage writes them .*found shards "
                                            r"compacted already .*; compact the shards of paths.parquet"):
        compact.compact(compact.job_from_params(project(other)))

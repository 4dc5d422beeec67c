"""Issue 33, reader side: shards appended in a later generation (their own label map, a class added that sorts
first) read through a format-2 overlay — every reader path (map, iterable, RowGroupSampler, the tables helpers,
`imagenet_parquet.check`) sees the same rows and labels; mixed label maps without such an overlay are refused; a
resume state of another version is refused; the epoch order interleaves the generations, so one appended class
does not fill the batches it lands in. Shards, overlays and the DVC tree are written directly (no stage runs)."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.check import check
from imagenet_parquet.format import FormatError, class_ids, shard_schema, stored_label_map
from imagenet_parquet.overlay import OverlayError, footer_digest, footer_tail, overlay_table, write_overlay
from imagenet_parquet.partition import epoch_order, rank_positions
from imagenet_parquet.tables import curated_sql, read_curated
from tasks.common.shard_writer import write_shard
from tests.helpers.datasets import contract_row
from tests.helpers.http_remote import publish
from tests.helpers.images import indexed_jpeg

PARAMS = {"policy": "passthrough"}


def folder_map(names: list[str]) -> dict[str, Any]:
    """A label map as the extract stage writes one for an image folder (no wnids: the class id is the name)."""
    classes = [{"label": i, "wnid": None, "name": n, "words": None, "ilsvrc2012_id": None} for i, n in enumerate(names)]
    return {"num_classes": len(names), "label_source": "folder", "classes": classes}


def write_split(root: Path, name: str, label_map: dict[str, Any], items: list[tuple[str, bytes]],
                generation: int = 0, row_group_rows: int = 4, split: str = "train") -> Path:
    """One shard `root/<split>/<name>` of `items` [(class id, image bytes)], written as convert writes (byte index,
    `curation: overlay`, generation G's metadata)."""
    ids = class_ids(label_map)
    schema = shard_schema(label_map, PARAMS, split, curation="overlay", generation=generation)
    rows = []
    for k, (cid, data) in enumerate(items):
        cls = label_map["classes"][ids.index(cid)]
        rows.append(contract_row(data, f"{cid}/{name}-{k:04d}.JPEG", cls["label"], cls["wnid"], cls["name"]))
    path = root / split / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, schema, row_group_rows, iter(rows))
    return path


def shard_entries(files: list[Path]) -> list[tuple[str, int, str]]:
    return [(f.name, pq.read_metadata(f).num_rows, footer_digest(footer_tail(f))) for f in files]


def write_layer(path: Path, files: list[Path], labels: np.ndarray, keep: np.ndarray, label_map: dict | None,
                extra: dict | None = None, split: str = "train") -> Path:
    """An overlay (or view: `extra` has `view`) of `files` at `path`."""
    counts = {"relabelled": 0, "excluded": int((~keep).sum()), **(extra or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_overlay(overlay_table(split, shard_entries(files), labels, keep, counts, label_map=label_map), path)
    return path


def sha_rows(files: list[Path]) -> dict[str, int]:
    """{sha256 of an image: its global row in these shards}: which row a raw sample (decode=False) is."""
    hashes = [h for f in files for h in pq.read_table(f, columns=["sha256"]).column(0).to_pylist()]
    return {h: i for i, h in enumerate(hashes)}


def samples(items, rows: dict[str, int]) -> list[tuple[int, int]]:
    return [(rows[hashlib.sha256(data).hexdigest()], int(label)) for data, label in items]


# ---------------------------------------------------------------- an append round: +1 class sorting first
OLD, NEW = ["cat", "dog"], ["ant", "cat", "dog"]


@pytest.fixture(scope="module")
def appended(tmp_path_factory) -> dict[str, Any]:
    """Generation 0: 24 images of cat/dog (2 shards); generation 1: 8 of `ant` and 4 more of dog (their own label
    map, where ant is 0); a format-2 overlay with the current map, one image removed from the source, one relabelled
    (dog -> ant), the new dog images' old copy (row 1) superseded."""
    repo = tmp_path_factory.mktemp("appended") / "repo"
    root = repo / "data" / "parquet"
    items = [(OLD[i % 2], indexed_jpeg(i)) for i in range(24)]
    files = [write_split(root, f"train-{s:05d}-of-00002.parquet", folder_map(OLD), items[s * 12:(s + 1) * 12])
             for s in range(2)]
    before = write_layer(repo / "data" / "overlay" / "train.parquet", files, np.array([i % 2 for i in range(24)]),
                         np.ones(24, bool), None)
    state = ParquetIterableDataset(root, "train", decode=False, seed=3).state_dict()
    added = [("ant", indexed_jpeg(100 + i)) for i in range(8)] + [("dog", indexed_jpeg(200 + i)) for i in range(4)]
    files.append(write_split(root, "train-g1-h0123456789abcdef.parquet", folder_map(NEW), added, generation=1))
    ids = [cid for cid, _ in items + added]
    ids[5] = "ant"  # relabelled
    keep = np.ones(len(ids), bool)
    keep[[3, 1]] = False  # removed from source; replaced by a newer version
    labels = np.array([NEW.index(c) for c in ids])
    write_layer(before, files, labels, keep, folder_map(NEW), {"removed": 1, "replaced": 1, "appended": 12})
    want = {i: int(labels[i]) for i in np.flatnonzero(keep)}
    return {"repo": repo, "root": root, "files": files, "want": want, "state": state, "labels": labels, "keep": keep}


def test_every_reader_path_sees_the_appended_rows_with_the_current_labels(appended):
    root, want = appended["root"], appended["want"]
    rows = sha_rows(appended["files"])
    ds = ParquetImageDataset(root, "train", decode=False)
    assert ds.classes == NEW and ds.label_names == NEW and ds.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    assert ds.label_map["num_classes"] == 3
    assert samples((ds[i] for i in range(len(ds))), rows) == sorted(want.items())
    assert ds.targets.tolist() == [want[i] for i in sorted(want)]
    sampler = RowGroupSampler(ds, seed=3)
    assert sorted(samples((ds[i] for i in sampler), rows)) == sorted(want.items())
    stream = ParquetIterableDataset(root, "train", decode=False, seed=3, batch_size=4)
    streamed = samples(stream, rows)
    assert sorted(streamed) == sorted(want.items())
    loader = DataLoader(stream, batch_size=4, num_workers=2, multiprocessing_context="fork", collate_fn=list)
    assert samples((s for batch in loader for s in batch), rows) == streamed  # the same order with workers
    assert [row for row, _ in samples((ds[i] for i in RowGroupSampler(ds, seed=3)), rows)] == [r for r, _ in streamed]
    table = read_curated(root, "train", columns=["image", "label", "wnid", "label_name"])
    got = [(rows[hashlib.sha256(r["image"]["bytes"]).hexdigest()], r["label"], r["label_name"])
           for r in table.to_pylist()]
    assert got == [(i, y, NEW[y]) for i, y in sorted(want.items())]
    sql = duckdb.sql(curated_sql(root, "train")).fetchall()
    names = duckdb.sql(curated_sql(root, "train")).columns
    assert [(r[names.index("label")], r[names.index("label_name")]) for r in sql] == [(y, NEW[y]) for _, y in
                                                                                      sorted(want.items())]


def test_mixed_label_maps_need_a_format_2_overlay(appended, tmp_path):
    root, files = appended["root"], appended["files"]
    with pytest.raises(FormatError, match=r"train-g1-.*same label map as .*no overlay.*format-2 overlay"):
        ParquetImageDataset(root, "train", overlay=False)
    one = write_layer(tmp_path / "v1.parquet", files, np.zeros(36, int), np.ones(36, bool), None)
    with pytest.raises(FormatError, match="format-1 overlay"):
        ParquetIterableDataset(root, "train", overlay=one)
    with pytest.raises(FormatError, match="same label map"):
        read_curated(root, "train", overlay=False)
    labels = appended["labels"].copy()
    labels[3] = -1  # an excluded row whose class is gone: allowed
    assert len(ParquetImageDataset(root, "train", overlay=write_layer(
        tmp_path / "ok.parquet", files, labels, appended["keep"], folder_map(NEW)))) == len(appended["want"])
    stored = stored_label_map(folder_map(NEW))
    stored = write_layer(tmp_path / "stored.parquet", files, labels, appended["keep"], stored)
    with pytest.raises(OverlayError, match=r"without class names.*store it whole"):  # folder classes: no wnid
        ParquetImageDataset(root, "train", overlay=stored)
    labels[0] = -1  # a kept row without a class: refused
    with pytest.raises(OverlayError, match=r"label -1 on a kept row \(0\)"):
        ParquetImageDataset(root, "train", overlay=write_layer(tmp_path / "bad.parquet", files, labels,
                                                               appended["keep"], folder_map(NEW)))


def test_a_resume_state_of_the_previous_version_is_refused(appended):
    stream = ParquetIterableDataset(appended["root"], "train", decode=False, seed=3)
    old = appended["state"]
    with pytest.raises(ValueError, match=r"num_samples|curation=.*another version"):
        stream.load_state_dict(old)
    with pytest.raises(ValueError, match=r"curation=.*another version of the dataset"):
        stream.load_state_dict({**old, "num_samples": len(stream)})
    stream.load_state_dict(stream.state_dict())  # this version's own state resumes


def test_check_sees_the_appended_shards(appended, tmp_path):
    repo = appended["repo"]
    publish(repo, tmp_path / "remote", ["data/parquet", "data/overlay"])
    problems, counts = check(repo)
    assert problems == [] and counts == {"shards": 3, "splits": 1}
    (repo / "data" / "parquet" / "train" / "train-g1-h0123456789abcdef.parquet").rename(tmp_path / "gone.parquet")
    problems, _ = check(repo)
    assert any("train-g1-h0123456789abcdef.parquet: expected (dvc.lock lists it), found no file" in p for p in problems)
    (tmp_path / "gone.parquet").rename(repo / "data" / "parquet" / "train" / "train-g1-h0123456789abcdef.parquet")


# ---------------------------------------------------------------- the order over generations
def _old_epoch_order(starts: np.ndarray, seed: int, epoch: int, window: int) -> np.ndarray:
    """epoch_order as it was before generations (issue 33): the reference for one generation."""
    units = np.random.default_rng([seed, epoch]).permutation(len(starts) - 1).astype(np.int64)
    sizes = starts[1:][units] - starts[:-1][units]
    rows = np.repeat(starts[:-1][units] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    rng = np.random.default_rng([seed, epoch, 1])
    bounds = np.concatenate([[0], np.cumsum(sizes)])[::window].tolist() + [len(rows)]
    for a, b in itertools.pairwise(bounds):
        rng.shuffle(rows[a:b])
    return rows


def test_one_generation_orders_as_before_and_several_interleave():
    starts = np.concatenate([[0], np.cumsum(np.random.default_rng(0).integers(1, 9, 40))])
    for seed, epoch, window in [(0, 0, 4), (5, 3, 1), (7, 1, 9)]:
        old = _old_epoch_order(starts, seed, epoch, window)
        assert np.array_equal(epoch_order(starts, seed, epoch, True, window), old)
        assert np.array_equal(epoch_order(starts, seed, epoch, True, window, np.zeros(40, np.int64)), old)
    generations = np.repeat([0, 1, 2], [30, 6, 4])
    order = epoch_order(starts, 5, 2, True, 4, generations)
    assert sorted(order.tolist()) == list(range(int(starts[-1])))
    assert np.array_equal(order, epoch_order(starts, 5, 2, True, 4, generations))  # a function of (seed, epoch)
    assert not np.array_equal(order, epoch_order(starts, 5, 3, True, 4, generations))
    first = int(starts[30])  # generation 0 alone: in the order it has without the others
    assert np.array_equal(order[order < first], _old_epoch_order(starts[:31], 5, 2, 4))
    for r, w in [(0, 3), (1, 3), (2, 3)]:  # elastic: ranks' positions still cover the epoch once
        assert len(rank_positions(len(order), 0, r, w)) in (len(order) // 3, len(order) // 3 + 1)


def _distinct_ratio(order: np.ndarray, labels: np.ndarray, batch: int = 256) -> tuple[float, int]:
    """(mean distinct classes per full batch ÷ the uniform expectation, most rows of the last class in a batch)."""
    p = np.bincount(labels) / len(labels)
    uniform = float(np.sum(1 - (1 - p) ** batch))
    batches = [labels[order[k:k + batch]] for k in range(0, len(order) - batch + 1, batch)]
    distinct = np.mean([len(np.unique(b)) for b in batches])
    return distinct / uniform, max(int((b == labels.max()).sum()) for b in batches)


def test_one_appended_class_spreads_over_the_batches():
    """4,950 rows of 100 classes in hashed order (50-row groups) + one new class of 50 rows (1 %) in one appended
    row group: distinct classes per batch of 256 >= 0.95 x uniform, and no batch dominated by the new class."""
    rng = np.random.default_rng(1)
    labels = np.concatenate([rng.permutation(np.arange(4950) % 99), np.full(50, 99)])
    starts = np.arange(0, 5001, 50)
    generations = np.repeat([0, 1], [99, 1])
    for epoch in range(3):
        ratio, most = _distinct_ratio(epoch_order(starts, 0, epoch, True, 4, generations), labels)
        assert ratio >= 0.95 and most <= 12, (ratio, most)
    _, most_before = _distinct_ratio(epoch_order(starts, 0, 0, True, 4), labels)
    assert most_before >= 40  # without the generations: the new class's row group lands in one or two batches

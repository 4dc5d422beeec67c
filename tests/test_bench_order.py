"""bench_order's pure helpers (benchmarks/bench_order.py): the uniform expectation, the mixing figures, and the
label-only model of each reader path, checked against real DataLoaders on tiny shards written by the benchmark's
own shard builder (both layouts)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_order as bench
from imagenet_parquet import ParquetImageDataset
from tasks.convert.plan import order_hash


def test_uniform_expectation() -> None:
    equal = bench.uniform_expectation(np.full(1000, 1281), 256)
    assert equal == pytest.approx(1000 * (1 - (1 - 1 / 1000) ** 256))
    assert 225.5 < equal < 226.5
    assert bench.uniform_expectation(np.array([1, 0]), 64) == pytest.approx(1.0)  # one class: one label a batch
    assert bench.uniform_expectation(bench.imagenet_counts(), 256) < equal  # unequal classes: fewer distinct


def test_distinct_and_same_class() -> None:
    batches = [np.array([0, 0, 1, 2]), np.array([3, 3, 3, 3]), np.array([5, 6])]  # the last one partial
    assert bench.distinct_per_batch(batches, 4).tolist() == [3, 1]
    counts = np.full(4, 10)
    assert bench.same_class_ratio(np.repeat(np.arange(4), 10), counts) == pytest.approx(36 / 39 * 4)
    assert bench.same_class_ratio(np.tile(np.arange(4), 10), counts) == 0.0
    shuffled = np.random.default_rng(0).permutation(np.repeat(np.arange(100), 1000))
    ratio = bench.same_class_ratio(shuffled, np.full(100, 1000))
    assert abs(ratio - 1) < 4 * bench.same_class_se(len(shuffled), np.full(100, 1000))


def test_imagenet_counts_and_starts() -> None:
    counts = bench.imagenet_counts()
    assert (counts.sum(), counts.min(), counts.max(), len(counts)) == (1_281_167, 732, 1300, 1000)
    assert bench.row_group_starts(bench.split_shards(23, 10), 4).tolist() == [0, 4, 8, 10, 14, 18, 20, 23]


@pytest.mark.parametrize("path", sorted(set(bench.PATHS.values())))
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_model_is_one_epoch(path: str, workers: int) -> None:
    starts = bench.row_group_starts(bench.split_shards(1000, 130), 20)
    batches = bench.loader_batches(path, starts, 32, workers, rng=np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert all(len(b) <= 32 for b in batches)


def test_sampler_and_iterable_with_batch_size_agree() -> None:
    """Passing batch_size: the iterable's batches are the sampler's (global step t = positions [tB, (t+1)B))."""
    starts = bench.row_group_starts(bench.split_shards(1000, 130), 20)
    sampler = bench.loader_batches("sampler", starts, 32, 1)
    for workers in (1, 2, 3):
        assert all(np.array_equal(a, b) for a, b in
                   zip(sampler, bench.loader_batches("iterable-batch", starts, 32, workers), strict=True))


def test_model_matches_real_loaders(tmp_path: Path) -> None:
    """The benchmark's shards (both layouts) read by real DataLoaders with 2 workers give exactly the label
    batches the label-only model predicts."""
    args = argparse.Namespace(classes=5, per_class=9, row_group_rows=4, sim_shard_rows=16)
    shards = bench.build_shards(tmp_path, args)
    names = [f"n{10000000 + k:08d}_{i + 1}.JPEG" for k in range(5) for i in range(9)]
    for layout, split in shards.items():
        ds = ParquetImageDataset(split, decode=False)
        assert ds.index.rows.tolist() == [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1]
        labels = ds.targets
        expected = sorted(range(45), key=lambda i: order_hash(names[i])) if layout == "hashed" else range(45)
        assert labels.tolist() == [i // 9 for i in expected]
        for path in ("iterable", "iterable-batch", "sampler"):
            got = [np.asarray(y) for _, y in bench.make_loader(path, split, 6, 2, decode=False)]
            model = bench.loader_batches(path, ds.index.starts, 6, 2)
            assert [labels[m].tolist() for m in model] == [g.tolist() for g in got], (layout, path)
    image, label = next(iter(bench.make_loader("shuffle", shards["hashed"], 4, 0, decode=True)))
    assert tuple(image.shape) == (4, 3, 32, 32) and len(label) == 4

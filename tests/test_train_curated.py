"""examples/train.py under torchrun (2 CPU processes, gloo) over shards with a curation overlay beside them (10 %
excluded, 10 % relabelled, found with no argument as the README's training command finds it): every step trains on
kept images only, with their curated labels; an epoch covers the kept images once; a run preempted mid-epoch and
resumed on another topology sees every remaining kept image exactly once."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers.datasets import write_shards
from tests.helpers.overlays import write_test_overlay
from tests.test_train_example import BATCH, EPOCHS, K, WORLD, by_step, epoch_ids, train

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.slow

TOTAL, CLASSES = 481, 10


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> tuple[Path, dict[str, int], set[str]]:
    """The Parquet root (its overlay at ../overlay), the curated label of every kept image by id (its sha256, the id
    the script logs), and the ids of the excluded images."""
    root = tmp_path_factory.mktemp("curated") / "parquet"
    files = write_shards(root, split="train", total=TOTAL, classes=CLASSES, shards=3, row_group_rows=16)
    table = pq.read_table(files, columns=["sha256", "label", "image"])
    ids, labels = table.column("sha256").to_pylist(), table.column("label").to_pylist()
    names = [image["path"] for image in table.column("image").to_pylist()]
    picked = random.Random(7).sample(range(TOTAL), 96)
    excluded, relabelled = set(picked[:48]), picked[48:]
    new = {i: (labels[i] + 3) % CLASSES for i in relabelled}
    write_test_overlay(root, labels={("train", names[i]): new[i] for i in relabelled},
                       exclude={("train", names[i]) for i in excluded})
    kept = {ids[i]: new.get(i, labels[i]) for i in range(TOTAL) if i not in excluded}
    return root, kept, {ids[i] for i in excluded}


@pytest.fixture(scope="module")
def runs(curated, tmp_path_factory) -> dict[str, tuple[str, list[dict]]]:
    """full: 2 epochs on 2 ranks; cut: stopped after K global steps; other: cut resumed in one process with the
    map-style reader, batch 16, 1 worker."""
    root = curated[0]
    out = tmp_path_factory.mktemp("curated-runs")
    base = ("--batch-size", str(BATCH), "--num-workers", "2")
    result = {"full": train(root, out / "full", *base)}
    ckpt = out / "cut.pt"
    result["cut"] = train(root, out / "cut", *base, "--max-steps", str(K), "--checkpoint", str(ckpt),
                           "--checkpoint-every", "1")
    result["other"] = train(root, out / "other", "--batch-size", str(WORLD * BATCH), "--num-workers", "1",
                            "--map-style", "--resume", str(ckpt), nproc=None)
    return result


def test_torchrun_trains_on_the_kept_images_with_their_curated_labels(curated, runs):
    _, kept, excluded = curated
    records = runs["full"][1]
    steps = by_step(records)
    per_epoch = len(kept) // WORLD // BATCH
    assert sorted(steps) == [(e, s) for e in range(EPOCHS) for s in range(1, per_epoch + 1)]
    for ranks in steps.values():
        assert sorted(ranks) == list(range(WORLD)) and not set(ranks[0]) & set(ranks[1])
    for epoch in range(EPOCHS):
        seen = epoch_ids(records, epoch)
        assert not set(seen) & excluded
        # uneven="drop": the kept images once each, all but what a whole global batch leaves over
        assert set(seen) <= set(kept) and max(seen.values()) == 1 and len(seen) == per_epoch * WORLD * BATCH
    assert all(r["labels"] == [kept[i] for i in r["ids"]] for r in records)  # the overlay's labels, not the shards'


def test_resumed_on_another_topology_sees_every_remaining_kept_image_once(curated, runs):
    _, kept, _ = curated
    cut, other = runs["cut"][1], runs["other"][1]
    assert "another topology" in runs["other"][0]
    rest = epoch_ids(other, 0)
    assert not set(rest) & set(epoch_ids(cut, 0))
    assert rest + epoch_ids(cut, 0) == Counter(kept.keys())  # 1 rank drops nothing: every kept image exactly once
    assert epoch_ids(other, 1) == Counter(kept.keys())
    assert all(r["labels"] == [kept[i] for i in r["ids"]] for r in other)

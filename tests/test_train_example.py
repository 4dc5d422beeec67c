"""examples/train.py under torchrun (2 CPU processes, gloo): every step's images are disjoint across ranks and an
epoch covers the shards once; a run preempted mid-epoch resumes exactly on the same topology and, on another
(1 process, the map-style reader, another batch size and worker count), sees every remaining image of the epoch
exactly once."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers.datasets import write_shards
from tests.helpers.project import REPO

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.slow

TOTAL, WORLD, BATCH, EPOCHS, K = 481, 2, 8, 2, 12  # 481 = 30 steps of 2 x 8 + 1 image "drop" leaves out
STEPS = TOTAL // WORLD // BATCH
BIN = Path(sys.executable).parent
TORCHRUN = BIN / "torchrun"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """The Parquet root and every image's label by id (its sha256, the id the script logs)."""
    root = tmp_path_factory.mktemp("train") / "parquet"
    files = write_shards(root, split="train", total=TOTAL, classes=10, shards=3, row_group_rows=16)
    table = pq.read_table(files, columns=["sha256", "label"])
    labels = dict(zip(table.column("sha256").to_pylist(), table.column("label").to_pylist(), strict=True))
    assert len(labels) == TOTAL  # the ids identify the images
    return root, labels


def train(root: Path, out: Path, *args: str, nproc: int | None = WORLD) -> tuple[str, list[dict]]:
    """One torchrun of the script (loopback only: --standalone), or with nproc=None one process without torchrun;
    its stdout and step log, sorted by step."""
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    log = out.with_suffix(".jsonl")
    launcher = [sys.executable] if nproc is None else [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [*launcher, str(REPO / "examples" / "train.py"), "--data", str(root), "--epochs", str(EPOCHS),
           "--step-log", str(log), "--seed", "3", *args]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return done.stdout, sorted(records, key=lambda r: (r["global_step"], r["rank"]))


def by_step(records: list[dict]) -> dict[tuple[int, int], dict[int, list[str]]]:
    """(epoch, step) -> {rank: the ids of its batch, in order}."""
    steps: dict[tuple[int, int], dict[int, list[str]]] = defaultdict(dict)
    for r in records:
        assert r["rank"] not in steps[r["epoch"], r["step"]]
        steps[r["epoch"], r["step"]][r["rank"]] = r["ids"]
    return dict(steps)


def epoch_ids(records: list[dict], epoch: int) -> Counter[str]:
    return Counter(i for r in records if r["epoch"] == epoch for i in r["ids"])


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory) -> dict[str, tuple[str, list[dict]]]:
    """full: 2 epochs on 2 ranks; cut: the same run stopped after K global steps (a checkpoint every step);
    same: cut resumed on its topology; other: cut resumed in one process (no torchrun) with the map-style reader
    (ParquetImageDataset + RowGroupSampler: the same epoch order), batch 16, 1 worker."""
    root, _ = shards
    out = tmp_path_factory.mktemp("runs")
    base = ("--batch-size", str(BATCH), "--num-workers", "2")
    result = {"full": train(root, out / "full", *base)}
    ckpt = out / "cut.pt"
    result["cut"] = train(root, out / "cut", *base, "--max-steps", str(K), "--checkpoint", str(ckpt),
                          "--checkpoint-every", "1")
    shutil.copy(ckpt, out / "other.pt")
    result["same"] = train(root, out / "same", *base, "--resume", str(ckpt))
    result["other"] = train(root, out / "other", "--batch-size", str(WORLD * BATCH), "--num-workers", "1",
                            "--map-style", "--resume", str(out / "other.pt"), nproc=None)
    return result


def test_each_step_splits_its_images_over_the_ranks_and_an_epoch_covers_the_shards_once(shards, runs):
    _, label = shards
    ids = set(label)
    stdout, records = runs["full"]
    steps = by_step(records)
    assert sorted(steps) == [(e, s) for e in range(EPOCHS) for s in range(1, STEPS + 1)]  # equal batch counts
    for ranks in steps.values():
        assert sorted(ranks) == list(range(WORLD)) and all(len(b) == BATCH for b in ranks.values())
        assert not set(ranks[0]) & set(ranks[1])
    for epoch in range(EPOCHS):
        seen = epoch_ids(records, epoch)
        # uneven="drop": each image at most once, all but the epoch's last position (481 = 2·240 + 1)
        assert set(seen) <= ids and max(seen.values()) == 1 and len(seen) == TOTAL - TOTAL % WORLD
    assert steps[1, 1] != steps[0, 1]  # a new order each epoch
    assert all(r["labels"] == [label[i] for i in r["ids"]] for r in records)
    assert all(math.isfinite(r["loss"]) for r in records)
    assert [line.split(":")[0] for line in stdout.splitlines()] == [f"epoch {e}" for e in range(EPOCHS)]


def test_a_preempted_run_resumed_on_its_topology_sees_exactly_the_rest_of_the_uninterrupted_run(runs):
    full, cut, same = (runs[k][1] for k in ("full", "cut", "same"))
    assert "stopped after global step 12" in runs["cut"][0]
    assert "same topology" in runs["same"][0]
    key = [(r["global_step"], r["rank"], r["epoch"], r["step"], r["ids"], r["labels"]) for r in full]
    assert [(r["global_step"], r["rank"], r["epoch"], r["step"], r["ids"], r["labels"]) for r in cut] == key[
        : WORLD * K
    ]
    assert [(r["global_step"], r["rank"], r["epoch"], r["step"], r["ids"], r["labels"]) for r in same] == key[
        WORLD * K :
    ]
    # model, optimizer and data restored: the resumed run trains as the uninterrupted one did
    assert [r["loss"] for r in same] == pytest.approx([r["loss"] for r in full[WORLD * K :]], rel=1e-3, abs=1e-4)


def test_a_preempted_run_resumed_on_another_topology_sees_every_remaining_image_once(shards, runs):
    ids = Counter(list(shards[1]))
    cut, other = runs["cut"][1], runs["other"][1]
    assert "another topology" in runs["other"][0]
    assert {r["rank"] for r in other} == {0} and other[0]["epoch"] == 0 and other[0]["step"] == K + 1
    rest = epoch_ids(other, 0)
    assert not set(rest) & set(epoch_ids(cut, 0))  # nothing the first K steps saw
    # 1 rank drops nothing: the rest of epoch 0 plus the first K steps is every image, exactly once
    assert rest + epoch_ids(cut, 0) == ids
    assert epoch_ids(other, 1) == ids  # and the next epoch is whole

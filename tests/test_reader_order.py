"""The epoch order as a training run sees it (issue 20): global step t holds the same images on any world size and
number of DataLoader workers (both readers, one order), and a loop killed mid-epoch resumes — through torchdata's
StatefulDataLoader on the same topology exactly, and from {"epoch", "samples_seen"} on another with every
remaining image exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify
from tests.helpers.project import REPO

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
from torch.utils.data import DataLoader  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
TOTAL, G = 47, 12  # not a multiple of the global batch


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("order")
    write_shards(root, total=TOTAL, classes=3, shards=3, row_group_rows=4)
    return root / "train"


def _steps(batches_per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Global steps: step t = the union of batch t of every rank (sorted)."""
    steps = max(len(b) for b in batches_per_rank)
    return [sorted(i for b in batches_per_rank if t < len(b) for i in b[t]) for t in range(steps)]


def _sampler_batches(shards: Path, world: int, workers: int, **kw) -> list[list[list[int]]]:
    ds = ParquetImageDataset(shards, transform=identify)
    out = []
    for rank in range(world):
        sampler = RowGroupSampler(ds, rank=rank, world_size=world, seed=5, **kw)
        loader = DataLoader(ds, batch_size=G // world, sampler=sampler, num_workers=workers)
        out.append([[int(i) for i in ids] for ids, _ in loader])
    return out


def _iterable_batches(shards: Path, world: int, workers: int, **kw) -> list[list[list[int]]]:
    out = []
    for rank in range(world):
        ds = ParquetIterableDataset(shards, transform=identify, seed=5, rank=rank, world_size=world,
                                    batch_size=G // world, **kw)
        loader = DataLoader(ds, batch_size=G // world, num_workers=workers,
                            multiprocessing_context="fork" if workers else None)
        out.append([[int(i) for i in ids] for ids, _ in loader])
    return out


def test_global_steps_are_the_same_images_on_any_world_size_and_worker_count(shards):
    reference = _steps(_sampler_batches(shards, 1, 0))
    assert sorted(i for step in reference for i in step) == list(range(TOTAL)) and len(reference) == 4
    assert reference[0] != list(range(G)) and len({len(s) for s in reference[:3]}) == 1
    for world in (2, 3, 4, 6):
        assert _steps(_sampler_batches(shards, world, 2)) == reference, world
    for world, workers in ((1, 0), (1, 3), (2, 2), (3, 0), (4, 2)):
        assert _steps(_iterable_batches(shards, world, workers)) == reference, (world, workers)
    # without batch_size the iterable still yields every image once per epoch, whatever the topology
    ds = ParquetIterableDataset(shards, transform=identify, seed=5, rank=0, world_size=1)
    assert sorted(int(i) for ids, _ in DataLoader(ds, batch_size=5, num_workers=2) for i in ids) == list(range(TOTAL))


def test_drop_and_pad_give_every_rank_the_same_number_of_batches(shards):
    for uneven, seen in (("drop", 45), ("pad", 47)):
        batches = _iterable_batches(shards, 3, 2, uneven=uneven)
        assert len({len(b) for b in batches}) == 1 and len({len(x) for b in batches for x in b[:-1]}) == 1
        ids = Counter(i for b in batches for x in b for i in x)
        assert len(ids) == seen and sum(ids.values()) == (45 if uneven == "drop" else 48)


def test_a_state_from_another_topology_resumes_every_remaining_image_exactly_once(shards):
    """Two ranks run 2 global steps; the rest of the epoch on three ranks (and other worker counts) from the
    global count the loop kept, and from the sampler's own state (global by construction)."""
    first = _iterable_batches(shards, 2, 2)
    done = [i for b in first for x in b[:2] for i in x]
    for world, workers in ((3, 2), (1, 0), (4, 3)):
        rest = []
        for rank in range(world):
            ds = ParquetIterableDataset(shards, transform=identify, seed=5, rank=rank, world_size=world,
                                        batch_size=G // world)
            ds.load_state_dict({"epoch": 0, "samples_seen": 2 * G})
            loader = DataLoader(ds, batch_size=G // world, num_workers=workers,
                                multiprocessing_context="fork" if workers else None)
            rest += [int(i) for ids, _ in loader for i in ids]
        assert sorted(done + rest) == list(range(TOTAL)), (world, workers)
    ds = ParquetImageDataset(shards, transform=identify)
    two = [RowGroupSampler(ds, rank=r, world_size=2, seed=5) for r in range(2)]
    its = [iter(s) for s in two]
    done = [next(it) for _ in range(G // 2) for it in its]  # one global step on two ranks
    state = two[0].state_dict()
    assert state["samples_seen"] == G and state["topology"] == [2, 1, 1, 1]
    rest = []
    for rank in range(3):
        sampler = RowGroupSampler(ds, rank=rank, world_size=3, seed=5)
        sampler.load_state_dict(state)
        rest += list(sampler)
    assert sorted(done + rest) == list(range(TOTAL))
    with pytest.raises(ValueError, match="seed=5"):
        RowGroupSampler(ds, seed=6).load_state_dict(state)


def test_a_worker_state_on_another_topology_is_refused_with_what_to_do(shards):
    ds = ParquetIterableDataset(shards, seed=5, rank=0, world_size=2, batch_size=6)
    state = {**ds.state_dict(), "topology": [2, 2, 6], "origin": 0, "samples_seen": 12}
    other = ParquetIterableDataset(shards, seed=5, rank=0, world_size=3, batch_size=4)
    with pytest.raises(ValueError, match="samples_seen"):
        other.load_state_dict(state)


LOOP = r"""
import json, os, sys, torch
from torchdata.stateful_dataloader import StatefulDataLoader
from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from tests.helpers.images import identify

shards, kind, log, ckpt, slow = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
if kind == "iterable":
    ds = ParquetIterableDataset(shards, transform=identify, seed=9, batch_size=4)
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
else:
    ds = ParquetImageDataset(shards, transform=identify)
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, sampler=RowGroupSampler(ds, seed=9))
step = 0
if os.path.exists(ckpt):
    saved = torch.load(ckpt, weights_only=False)
    loader.load_state_dict(saved["loader"])
    step = saved["step"]
for ids, _ in loader:
    step += 1
    with open(log, "a") as fh:
        fh.write(json.dumps({"step": step, "ids": [int(i) for i in ids]}) + "\n")
    torch.save({"loader": loader.state_dict(), "step": step}, ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
    import time; time.sleep(slow)
"""


def _loop(shards: Path, kind: str, log: Path, ckpt: Path, slow: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", LOOP, str(shards), kind, str(log), str(ckpt), str(slow)],
                            cwd=REPO, env=env)


def _log(path: Path) -> dict[int, list[int]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {entry["step"]: entry["ids"] for entry in lines}


@pytest.mark.parametrize("kind", ["iterable", "sampler"])
def test_a_loop_killed_mid_epoch_resumes_the_rest_of_the_epoch_exactly(shards, tmp_path, kind):
    """SIGKILL a real training loop (StatefulDataLoader, 2 workers, a checkpoint after every step) mid-epoch;
    restarted from its checkpoint it yields exactly the steps an uninterrupted run yields after that step."""
    whole = tmp_path / "whole.jsonl"
    assert _loop(shards, kind, whole, tmp_path / "whole.pt").wait(120) == 0
    uninterrupted = _log(whole)
    assert sorted(i for ids in uninterrupted.values() for i in ids) == list(range(TOTAL)) and len(uninterrupted) == 12
    log, ckpt = tmp_path / "run.jsonl", tmp_path / "run.pt"
    proc = _loop(shards, kind, log, ckpt, slow=0.3)
    deadline = time.monotonic() + 120
    while (not log.exists() or len(_log(log)) < 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    saved = torch.load(ckpt, weights_only=False)["step"]
    assert 3 <= saved < 12, saved  # killed mid-epoch (step 4 logged: checkpoint 3 saved at least)
    assert _loop(shards, kind, log, ckpt).wait(120) == 0
    resumed = _log(log)  # steps after the checkpoint were rewritten by the resumed run
    assert resumed == uninterrupted

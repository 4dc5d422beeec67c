"""The node-aware epoch order (issue 47): canonical partitions make global step t the same images on 1, 2, 4 or 8
nodes (any ranks per node), each node reads only the row groups of its partitions (the same ones every epoch), a
resume crosses node counts with every remaining image once, and states of another order are refused by name."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.partition import canonical_partitions, node_slot, partitioned_order, rank_positions
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify

TOTAL, ROWS, C, G = 601, 10, 8, 24  # 61 row groups (the last one short); a global batch of 24 images
TOPOLOGIES = [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (4, 1), (4, 2), (8, 1), (8, 3)]  # (nodes, ranks per node)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    write_shards(root, total=TOTAL, classes=5, shards=4, row_group_rows=ROWS)
    return root / "train"


def _rank(shards, nodes: int, per: int, rank: int, **kw) -> ParquetIterableDataset:
    world = nodes * per
    return ParquetIterableDataset(shards, decode=False, seed=3, rank=rank, world_size=world, ranks_per_node=per,
                                  batch_size=G // world, canonical_nodes=kw.pop("canonical_nodes", C), **kw)


def _ids(ds) -> list[int]:
    """The image indices a rank yields, in order (read in this process: no DataLoader workers)."""
    from io import BytesIO

    from PIL import Image

    return [identify(Image.open(BytesIO(data))) for data, _ in ds]


def _global_steps(per_rank: list[list[int]], batch: int) -> list[list[int]]:
    steps = max(-(-len(r) // batch) for r in per_rank)
    return [sorted(i for r in per_rank for i in r[t * batch:(t + 1) * batch]) for t in range(steps)]


def _units(shards, ids: list[int]) -> set[int]:
    return {i // ROWS for i in ids}  # write_shards: image i is global row i, row groups of ROWS rows


def test_partitioned_order_is_every_kept_row_once_a_function_of_seed_and_epoch_with_fixed_partitions():
    starts = np.concatenate([[0], np.cumsum([ROWS] * 60 + [1])])
    order = partitioned_order(starts, 3, 0, C)
    assert sorted(order.tolist()) == list(range(TOTAL))
    assert np.array_equal(order, partitioned_order(starts, 3, 0, C))
    again, other_seed = partitioned_order(starts, 3, 1, C), partitioned_order(starts, 4, 0, C)
    assert not np.array_equal(order, again) and not np.array_equal(order, other_seed)
    rows, bounds = canonical_partitions(starts, 3, C)
    sizes = np.diff(bounds)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == TOTAL
    for c in range(C):  # position k holds partition k mod C, in every epoch: the partitions' rows never move
        part = set(rows[bounds[c]:bounds[c + 1]].tolist())
        assert set(order[c::C].tolist()) == part == set(again[c::C].tolist())
    keep = np.random.default_rng(0).random(TOTAL) < 0.3
    kept = partitioned_order(starts, 3, 0, C, keep=keep)
    assert sorted(kept.tolist()) == np.flatnonzero(keep).tolist()
    with pytest.raises(ValueError, match="canonical_nodes: expected an int"):
        partitioned_order(starts, 3, 0, 0)


def test_node_slots_put_every_position_of_a_node_on_its_partitions_from_any_origin():
    for nodes, per in TOPOLOGIES:
        world = nodes * per
        for origin in (0, 5, 37):
            taken = []
            for rank in range(world):
                slot = node_slot(rank, world, nodes, origin)
                positions = rank_positions(100, origin, slot, world)
                assert np.all(positions % nodes == rank // per), (nodes, per, origin, rank)
                taken += positions.tolist()
            assert sorted(taken) == list(range(origin, 100))


def test_the_same_global_steps_on_1_2_4_8_nodes_and_each_node_reads_its_share(shards):
    reference = None
    for nodes, per in TOPOLOGIES:
        world = nodes * per
        per_rank = [_ids(_rank(shards, nodes, per, r)) for r in range(world)]
        steps = _global_steps(per_rank, G // world)
        assert sorted(i for s in steps for i in s) == list(range(TOTAL))
        if reference is None:
            reference = steps
        assert steps == reference, (nodes, per)
        if nodes > 1:
            read = [_units(shards, [i for r in range(n * per, (n + 1) * per) for i in per_rank[r]]) for n in range(nodes)]
            assert sum(len(u) for u in read) <= 61 + C, (nodes, [len(u) for u in read])  # bounds: +1 group each
            assert all(len(u) <= 61 / nodes + C / nodes + 1 for u in read), (nodes, [len(u) for u in read])
    assert reference[0] != list(range(G))
    # the map-style sampler gives the same global steps (and is node-aware too)
    ds = ParquetImageDataset(shards, transform=identify)
    for nodes, per in ((1, 1), (2, 2), (4, 1)):
        world = nodes * per
        per_rank = [[int(ds[i][0]) for i in RowGroupSampler(ds, seed=3, rank=r, world_size=world, ranks_per_node=per,
                                                            canonical_nodes=C)] for r in range(world)]
        assert _global_steps(per_rank, G // world) == reference


def test_a_node_reads_the_same_row_groups_every_epoch(shards):
    groups = []
    for epoch in (0, 1):
        ds = _rank(shards, 4, 1, 2)
        ds.set_epoch(epoch)
        groups.append((_ids(ds)))
    assert groups[0] != groups[1] and _units(shards, groups[0]) == _units(shards, groups[1])


def test_a_resume_on_another_node_count_sees_every_remaining_image_once_in_the_same_steps(shards):
    full = _global_steps([_ids(_rank(shards, 2, 2, r)) for r in range(4)], G // 4)
    done = 5  # global steps finished on 2 nodes x 2 ranks, then the run resumes on 4 nodes x 2 ranks
    state = {"epoch": 0, "samples_seen": done * G, "canonical_nodes": C}
    rest = []
    for rank in range(8):
        ds = _rank(shards, 4, 2, rank, canonical_nodes="auto")
        ds.load_state_dict(state)
        rest.append(_ids(ds))
    assert _global_steps(rest, G // 8) == full[done:]
    assert Counter(i for s in full[:done] for i in s) + Counter(i for r in rest for i in r) == Counter(range(TOTAL))
    # a state saved by the reader itself (its canonical_nodes and topology) on one node resumes on two
    one = _rank(shards, 1, 1, 0, canonical_nodes="auto")
    assert one.canonical_nodes is None  # one node, nothing asked: the order that is not node-aware
    saved = _rank(shards, 1, 2, 0).state_dict()
    assert saved["canonical_nodes"] == C and saved["topology"] == [2, 1, G // 2, 1]
    adopt = _rank(shards, 2, 1, 0, canonical_nodes="auto")
    adopt.load_state_dict(saved)
    assert adopt.canonical_nodes == C


def test_states_and_topologies_of_another_order_are_refused_naming_the_field(shards, monkeypatch):
    saved = _rank(shards, 2, 1, 0).state_dict()
    with pytest.raises(ValueError, match=r"state\['canonical_nodes'\]: expected canonical_nodes=16 .* found 8"):
        _rank(shards, 2, 1, 0, canonical_nodes=16).load_state_dict(saved)
    legacy = ParquetIterableDataset(shards, decode=False, seed=3, rank=0, world_size=2, batch_size=12).state_dict()
    assert "canonical_nodes" not in legacy  # the order that is not node-aware (one node by default)
    with pytest.raises(ValueError, match=r"canonical_nodes.*found None"):
        _rank(shards, 2, 1, 0).load_state_dict(legacy)
    with pytest.raises(ValueError, match=r"canonical_nodes: expected a multiple of the number of nodes \(3"):
        _rank(shards, 3, 1, 0)
    with pytest.raises(ValueError, match=r"ranks_per_node: expected a divisor of world_size=4"):
        ParquetIterableDataset(shards, rank=0, world_size=4, ranks_per_node=3)
    with pytest.raises(ValueError, match=r"canonical_nodes: expected an int in \[1, 65536\]"):
        _rank(shards, 1, 1, 0, canonical_nodes="64")
    # torchrun's variables: LOCAL_WORLD_SIZE gives the nodes; ranks must be numbered node by node
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ds = ParquetIterableDataset(shards, rank=1, world_size=4)
    assert ds.nodes == 2 and ds.canonical_nodes == 64  # several nodes, nothing asked: the documented default
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match=r"rank 1: expected ranks numbered node by node"):
        ParquetIterableDataset(shards, rank=1, world_size=4)

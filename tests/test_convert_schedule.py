"""Convert hands the largest shards to the workers first (issue 11: no long tail with one worker idle); the order
of work never changes what is written (tests/test_convert_flow.py: byte-identical for any worker count)."""
from __future__ import annotations

from tasks.convert.plan import ShardPlan, largest_first


def _plan(split: str, index: int, size: int) -> ShardPlan:
    return ShardPlan(split, index, 5, index * 10, index * 10 + 10, size, f"k{index}", f"s{index}")


def test_largest_shards_go_first_ties_in_plan_order():
    plans = [_plan("train", 0, 300), _plan("train", 1, 900), _plan("train", 2, 300), _plan("val", 0, 900),
             _plan("train", 3, 50)]
    order = [(p.split, p.index) for p in largest_first(plans)]
    assert order == [("train", 1), ("val", 0), ("train", 0), ("train", 2), ("train", 3)]
    assert largest_first(plans[::-1]) == largest_first(plans), "the order depends on the plans only"
    assert sorted(largest_first(plans), key=plans.index) == plans, "every shard once"

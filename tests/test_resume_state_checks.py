"""`load_state_dict` checks every field of a resume state when it is loaded — one ValueError
naming the field, the value found and the valid range — for ParquetIterableDataset and RowGroupSampler alike,
instead of an IndexError, a MemoryError, a numpy error or a bare int() error later; the states that resume today
(state_dict()'s, and {"epoch": e, "samples_seen": n} built by a training loop) still resume."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify

TOTAL, SEED = 47, 5
NAN = math.nan


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    write_shards(root, total=TOTAL, classes=3, shards=3, row_group_rows=4)
    return root / "train"


def _iterable(shards: Path, **kw) -> ParquetIterableDataset:
    return ParquetIterableDataset(shards, transform=identify, seed=SEED, **kw)


def _sampler(shards: Path, **kw) -> RowGroupSampler:
    return RowGroupSampler(ParquetImageDataset(shards, transform=identify), seed=SEED, **kw)


MAKERS = {"iterable": _iterable, "sampler": _sampler}
GOOD = {"version": 1, "seed": SEED, "num_samples": TOTAL, "epoch": 1, "samples_seen": 12, "origin": 0,
        "topology": [1, 1, 1]}
BAD_INTS = [None, "3", 3.0, 2.5, NAN, math.inf, True, False, [3], {"n": 3}, np.float64(3), b"3", np.bool_(True),
            torch.tensor(True), torch.tensor(3.0), torch.tensor([3])]
BAD = (  # (field, value)
    [("epoch", v) for v in [-1, -(2**70), 2**64, *BAD_INTS]]
    + [("samples_seen", v) for v in [-1, TOTAL + 1, 2**70, -(2**63), *BAD_INTS]]
    + [("origin", v) for v in [-1, 13, TOTAL, 2**60, 8 * 2**50 * 7, -(2**62), *BAD_INTS]]
    + [("topology", v) for v in [[1, 1], [1, 1, 1, 1, 1], [], [0, 1, 1], [1, 0, 1], [1, 1, 0], [-1, 1, 1],
                                 [2**40, 1, 1], [1.0, 1, 1], ["1", 1, 1], [True, 1, 1], [None, 1, 1],
                                 [NAN, 1, 1], "111", 5, {"world_size": 1}, [[1], 1, 1], b"\x01\x01\x01"]]
    + [("version", v) for v in [0, 2, -1, 99, "1", 1.0, True, NAN, [1]]]
    + [("seed", v) for v in [SEED + 1, str(SEED), float(SEED), NAN]]
    + [("num_samples", v) for v in [TOTAL - 1, TOTAL + 1, str(TOTAL), float(TOTAL), None, True]]
)


def _id(case) -> str:
    return f"{case[0]}={case[1]!r}"[:40]


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("case", BAD, ids=_id)
def test_a_bad_field_is_one_value_error_naming_it_at_load(shards, kind, case):
    field, value = case
    target = MAKERS[kind](shards)
    before = target.state_dict()
    with pytest.raises(ValueError) as err:
        target.load_state_dict({**GOOD, field: value})
    message = str(err.value)
    assert type(err.value) is ValueError and "\n" not in message
    assert f"state['{field}']" in message and "expected" in message, message
    found = repr(value)
    assert found[:60] in message or found in message, message
    if field not in ("seed", "num_samples", "topology", "version"):
        assert re.search(r"\[-?\d+, \d+\]", message), message  # the valid range
    assert target.state_dict() == before  # nothing of the bad state was kept
    assert len(list(target)) == TOTAL  # and it still iterates a whole epoch


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("state", [None, [], "epoch", 3, {"epoch": 0}, {"samples_seen": 0}, {"topology": [1, 1, 1]}],
                         ids=repr)
def test_a_state_that_is_no_state_is_one_value_error(shards, kind, state):
    with pytest.raises(ValueError, match=r"state: expected a dict with 'epoch' and 'samples_seen'"):
        MAKERS[kind](shards).load_state_dict(state)


def _ids(target, kind: str) -> list[int]:
    if kind == "sampler":
        return list(target)
    return [int(i) for i, _ in target]


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_valid_states_of_today_still_resume(shards, kind):
    make = MAKERS[kind]
    whole = _ids(make(shards), kind)
    assert sorted(whole) == list(range(TOTAL))
    first = make(shards)
    it = iter(first)
    done = [next(it) for _ in range(10)]
    saved = first.state_dict()
    assert saved["samples_seen"] == 10 and saved["version"] == 1
    loop = {"epoch": 0, "samples_seen": 10}
    variants = [saved, json.loads(json.dumps(saved)), {**saved, "topology": tuple(saved["topology"])}, loop,
                {"epoch": np.int64(0), "samples_seen": np.int32(10)}, {"epoch": torch.tensor(0), "samples_seen":
                torch.tensor(10)}, {**loop, "version": 1, "seed": np.int64(SEED), "num_samples": TOTAL},
                {**loop, "topology": None}]
    for state in variants:
        target = make(shards)
        target.load_state_dict(state)
        assert _ids(target, kind) == whole[10:], state
    assert len(done) == 10
    edges = [({"epoch": 0, "samples_seen": 0}, whole), ({"epoch": 0, "samples_seen": TOTAL}, []),
             ({**saved, "origin": 10}, whole[10:]), ({**saved, "samples_seen": TOTAL, "origin": TOTAL}, [])]
    for state, expected in edges:
        target = make(shards)
        target.load_state_dict(state)
        assert _ids(target, kind) == expected, state
    later = make(shards)
    later.load_state_dict({"epoch": 3, "samples_seen": 5})
    assert later.epoch == 3 and len(_ids(later, kind)) == TOTAL - 5

"""A hostile layout history (issue 49 item 3): versions/layout.json truncated, bytes flipped, values of other types,
generations duplicated and reordered, shard names outside the contract (`..`, absolute, another split's), huge
numbers, a history of another revision — seeded, over a project of two generations in both splits. For every case
convert either runs clean, its metrics and history what the shards hold and every image as a fresh convert gives
it (tests/helpers/histories.py `assert_true_run`), or refuses in one PipelineError line naming versions/layout.json
and writes no count; never a traceback, a lost row or a wrong count. The convert stage is run in-process on the
small project (~0.1 s a case)."""
from __future__ import annotations

import copy
import json
import random
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tasks.common import PipelineError
from tests.helpers.histories import LAYOUT, assert_true_run, build, convert, linked_copy
from tests.helpers.project import REPO

CASES = 160  # seeded cases; each kind below gets CASES / len(KINDS)
HOSTILE_NAMES = ["..parquet", ".parquet", "../train-h0123456789abcdef.parquet", "/etc/passwd", "/tmp/x.parquet",
                 "train/../../x.parquet", "val-h0123456789abcdef.parquet", "train-g1-h0123456789abcdef.parquet",
                 "train-h0123456789abcdef.parquet\x00", "train-h0123456789ABCDEF.parquet", "", "train-.parquet",
                 "train-h0123456789abcdef.parquet.parquet", "ü" * 300, "train-g0-h0123456789abcdef.parquet"]
HUGE = [2**63, 2**63 - 1, 2**64 + 1, 10**30, -(2**63), 1e308, -1, 0]
OTHER_TYPES = ["x", "", 7, -3, 1.5, True, False, None, [], {}, [1], {"a": 1}]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = build(tmp_path_factory.mktemp("fuzz"))
    base["repo"] = REPO  # the repository's own versions/layout.json: another project's, another revision
    return base


def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    """Every location in a JSON document (containers too)."""
    found = [path]
    if isinstance(node, dict):
        for key in sorted(node):
            found += _leaves(node[key], (*path, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _leaves(item, (*path, index))
    return found


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _text(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def truncate(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    return raw[: rng.randrange(len(raw))]


def flip(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    return bytes(data)


def swap_type(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    path = rng.choice(_leaves(doc))
    return _text(_set(doc, path, rng.choice([v for v in OTHER_TYPES if type(v) is not type(_get(doc, path))])))


def _generations(rng: random.Random, doc: Any) -> list:
    return doc["splits"][rng.choice(sorted(doc["splits"]))]


def duplicate(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    gens = _generations(rng, doc)
    what = rng.choice(["generation", "shard", "bad"])
    if what == "generation":
        gens.insert(rng.randrange(len(gens) + 1), copy.deepcopy(rng.choice(gens)))
    else:
        gen = rng.choice([g for g in gens if g["shards" if what == "shard" else "bad"]] or gens)
        items = gen["shards" if what == "shard" else "bad"]
        if items:
            items.insert(rng.randrange(len(items) + 1), copy.deepcopy(rng.choice(items)))
    return _text(doc)


def reorder(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    gens = _generations(rng, doc)
    target = rng.choice([gens, *[g["shards"] for g in gens]])  # generations, or a generation's shards (harmless)
    rng.shuffle(target)
    return _text(doc)


def rename(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    gens = _generations(rng, doc)
    shard = rng.choice([s for g in gens for s in g["shards"]])
    shard["name"] = rng.choice([*HOSTILE_NAMES, "".join(rng.choice("abc-./\\~h0") for _ in range(12))])
    return _text(doc)


def huge(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    numbers = [p for p in _leaves(doc) if type(_get(doc, p)) is int]
    path = rng.choice(numbers)
    if rng.random() < 0.25:  # what no JSON parser gives back as the number written
        return raw.replace(b"%d" % _get(doc, path), rng.choice([b"1e999", b"9" * 5000, b"NaN", b"-0.0"]), 1)
    return _text(_set(doc, path, rng.choice([*HUGE, _get(doc, path) + rng.choice([-1, 1])])))


def other_revision(rng: random.Random, raw: bytes, doc: Any, built: dict) -> bytes:
    """The history of the repository (another project), of v0 (the revision before), of a fresh convert of this
    source (another layout), or v1's with one split of another."""
    source = rng.choice(["repo", "v0", "fresh", "mixed"])
    if source != "mixed":
        return (built[source] / LAYOUT).read_bytes()
    older = json.loads((built["v0"] / LAYOUT).read_bytes())
    split = rng.choice(sorted(doc["splits"]))
    doc["splits"][split] = older["splits"][split]
    return _text(doc)


KINDS: list[Callable[[random.Random, bytes, Any, dict], bytes]] = [
    truncate, flip, swap_type, duplicate, reorder, rename, huge, other_revision]


@pytest.mark.parametrize("seed", range(CASES))
def test_a_hostile_history_gives_a_true_run_or_one_line(built, tmp_path, seed):
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    root = linked_copy(built["v1"], tmp_path / "case")
    raw = (root / LAYOUT).read_bytes()
    hostile = kind(rng, raw, json.loads(raw), built)
    (root / LAYOUT).unlink()
    (root / LAYOUT).write_bytes(hostile)
    metrics = (root / "data/metrics/convert.json").read_bytes()
    try:
        result = convert(root)
    except PipelineError as err:
        message = str(err)
        assert "\n" not in message and f"{root / LAYOUT}" in message, (kind.__name__, message)
        assert (root / LAYOUT).read_bytes() == hostile and (root / "data/metrics/convert.json").read_bytes() == metrics
        return
    assert_true_run(root, built["fresh"], result)


def test_every_kind_is_drawn_and_some_cases_run_clean(built, tmp_path):
    """The corpus is not all refusals: a reordered shard list, v0's history and a fresh convert's run clean."""
    assert CASES >= 4 * len(KINDS)
    for source in ("v0", "fresh", "repo"):
        root = linked_copy(built["v1"], tmp_path / source)
        (root / LAYOUT).unlink()
        shutil.copy(built[source] / LAYOUT, root / LAYOUT)
        assert_true_run(root, built["fresh"], convert(root))


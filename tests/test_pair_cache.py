"""Near-duplicate searches kept in validate's scratch space (tasks/validate/near_dup.py PairCache): reused while the
fingerprints are unchanged, never trusted when the kept file disagrees with them, and the same pairs whether an
excluded row is searched and dropped after or never searched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tasks.validate import near_dup
from tasks.validate.near_dup import Fingerprints, PairCache, near_pairs, train_groups, train_val_pairs


def _prints(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    base[1::7] = base[::7][: len(base[1::7])] ^ np.uint64(0b1011)  # near copies: distance 3
    return base


class Counted:
    """near_pairs, counting its calls (put in near_dup's namespace, where PairCache finds it)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, q: np.ndarray, t: np.ndarray, d: int, self_join: bool = False) -> pd.DataFrame:
        self.calls += 1
        return near_pairs(q, t, d, self_join)


def test_a_kept_search_is_reused_and_a_bad_one_searched_again(tmp_path: Path, monkeypatch) -> None:
    queries, indexed = _prints(300, 1), _prints(2000, 2)
    indexed[5] = queries[3] ^ np.uint64(1)  # one train/val pair
    search = Counted()
    monkeypatch.setattr(near_dup, "near_pairs", search)
    first = PairCache(tmp_path / "near").pairs(queries, indexed, 8, False)
    assert len(first) >= 1 and search.calls == 1
    pd.testing.assert_frame_equal(PairCache(tmp_path / "near").pairs(queries, indexed, 8, False), first)
    assert search.calls == 1, "unchanged fingerprints: the kept result"
    (kept,) = (tmp_path / "near").glob("*.npz")
    for bad in (b"not an npz", None):
        if bad is None:  # a well-formed file whose distances disagree with the fingerprints
            np.savez(kept, query=first["query"], indexed=first["indexed"], distance=first["distance"] + 1)
        else:
            kept.write_bytes(bad)
        again = PairCache(tmp_path / "near").pairs(queries, indexed, 8, False)
        pd.testing.assert_frame_equal(again, first)
    assert search.calls == 3
    changed = indexed.copy()
    changed[0] ^= np.uint64(1 << 40)
    PairCache(tmp_path / "near").pairs(queries, changed, 8, False)
    assert search.calls == 4, "another fingerprint: another key"


def test_prune_keeps_only_what_this_run_used(tmp_path: Path) -> None:
    a, b = _prints(100, 3), _prints(100, 4)
    PairCache(tmp_path).pairs(a, a, 4, True)
    run = PairCache(tmp_path)
    run.pairs(b, b, 4, True)
    (tmp_path / "other.txt").write_text("not ours")
    run.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*run.used, "other.txt"])


def _split(prints: np.ndarray, keep: np.ndarray) -> Fingerprints:
    n = len(prints)
    frame = pd.DataFrame(
        {
            "phash": prints,
            "printed": np.ones(n, dtype=bool),
            "label": (np.arange(n) % 5).astype(np.int32),
            "shard": np.zeros(n, dtype=np.int32),
            "row": np.arange(n, dtype=np.int32),
        }
    )
    frame["valid"] = keep
    frame["source"] = frame["label"]
    return Fingerprints(frame, [Path("shard.parquet")])


def test_excluded_rows_are_dropped_after_the_search(tmp_path: Path, monkeypatch) -> None:
    train, val = _prints(1500, 5), _prints(200, 6)
    train[::50] = val[: len(train[::50])] ^ np.uint64(0b11)  # 30 train/val pairs
    keep_train = np.ones(len(train), dtype=bool)
    keep_train[::100] = False  # half of the train ends excluded
    keep_val = np.ones(len(val), dtype=bool)
    keep_val[1] = False
    monkeypatch.setattr(near_dup, "_named", lambda prints, rows, classes: rows.assign(name=rows["row"], wnid="w"))
    prints = {"train": _split(train, keep_train), "val": _split(val, keep_val)}
    cached = PairCache(tmp_path / "near")
    got = train_val_pairs(prints, 8, None, cached)
    groups = train_groups(prints, 4, cached)
    # the reference: only the kept rows searched
    expected = near_pairs(val[keep_val], train[keep_train], 8)
    assert len(got) == len(expected) > 0
    kept_val_rows, kept_train_rows = np.flatnonzero(keep_val), np.flatnonzero(keep_train)
    assert sorted(zip(got["val_row"], got["train_row"], strict=True)) == sorted(
        zip(kept_val_rows[expected["query"]], kept_train_rows[expected["indexed"]], strict=True)
    )
    inside = near_pairs(train[keep_train], train[keep_train], 4, True)
    assert groups["pairs"] == len(inside)
    assert train_groups(prints, 4, PairCache(None)) == groups
    # a curation round: other exclusions, the same fingerprints -> the kept searches, the new keep flags applied
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "near").iterdir()}
    keep_train[::100] = True
    keep_train[::3] = False
    prints = {"train": _split(train, keep_train), "val": _split(val, keep_val)}
    again = train_val_pairs(prints, 8, None, cached)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "near").iterdir()} == files
    expected = near_pairs(val[keep_val], train[keep_train], 8)
    assert len(again) == len(expected) != len(got)

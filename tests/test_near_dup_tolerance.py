"""The near-duplicate tolerance scales with train x val: synthetic fingerprints at chance level (uniform, 32 of 64
bits set, as dct64-v2's) stay within it at any size while a fixed count fails; planted duplicates exceed it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.validate.near_dup import chance_probability, near_pairs, popcount, tolerance
from tests.helpers.params import validate_section

DISTANCE = 14  # wide enough that 1,000 x 20,000 uniform prints give ~130 chance pairs


def _prints(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` uniform fingerprints with exactly 32 of 64 bits set."""
    bits = np.zeros((n, 64), dtype=np.uint64)
    bits[:, :32] = 1
    bits = rng.permuted(bits, axis=1)
    return (bits << np.arange(64, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)


def _found(train: np.ndarray, val: np.ndarray) -> int:
    return len(near_pairs(val, train, DISTANCE))


def test_chance_probability_is_the_exact_fraction_of_weight_32_pairs():
    assert chance_probability(0) == 1 / math.comb(64, 32)
    assert chance_probability(1) == chance_probability(0)  # distances between weight-32 prints are even
    assert chance_probability(8) == pytest.approx(7.19e-10, rel=1e-3)
    assert chance_probability(64) == pytest.approx(1.0)
    a = _prints(np.random.default_rng(1), 20_000)
    assert set(popcount(a).tolist()) == {32}
    distances = popcount(a[:10_000] ^ a[10_000:])  # 10,000 independent pairs: the model's mean and spread
    assert abs(distances.mean() - 32) < 0.2 and set(distances.tolist()) <= set(range(0, 65, 2))


def test_chance_pairs_stay_within_the_tolerance_at_any_size_a_fixed_count_does_not():
    rng = np.random.default_rng(0)
    train, val = _prints(rng, 20_000), _prints(rng, 1_000)
    found_small, found_large = _found(train[:2_000], val), _found(train, val)
    small, large = (tolerance(n, len(val), DISTANCE, 100, 20) for n in (2_000, len(train)))
    assert large.comparisons == 2 * 10**7 and large.expected == pytest.approx(2e7 * chance_probability(DISTANCE))
    assert 0.6 * large.expected < found_large < 1.4 * large.expected  # chance level, as the model says
    assert large.tolerated == math.floor(20 * large.expected) and small.tolerated == math.floor(20 * small.expected)
    assert small.status(found_small) == "warn" and large.status(found_large) == "warn"
    fixed = [tolerance(n, len(val), DISTANCE, 100, 0) for n in (2_000, len(train))]  # margin 0: the fixed count
    assert [f.tolerated for f in fixed] == [100, 100]
    assert fixed[0].status(found_small) == "warn" and fixed[1].status(found_large) == "fail"  # 10x the data: fails


def test_planted_duplicates_above_the_chance_level_fail_and_the_message_says_expected_and_tolerated():
    rng = np.random.default_rng(2)
    train, val = _prints(rng, 20_000), _prints(rng, 4_000)
    allowed = tolerance(len(train), len(val), 10, 0, 20)
    assert allowed.status(len(near_pairs(val, train, 10))) == "warn"  # chance alone: ~2 pairs, 36 tolerated
    val[:100] = train[rng.choice(len(train), 100, replace=False)]  # 100 real duplicates
    found = len(near_pairs(val, train, 10))
    assert found >= 100 and allowed.tolerated == math.floor(20 * allowed.expected) == 36
    assert allowed.status(found) == "fail"
    assert allowed.describe() == (
        "expected by chance: 1.83 among 8e+07 train x val comparisons (unrelated uniform fingerprints); "
        "tolerated: 36 = max(params.yaml validate.near_duplicates_max_pairs 0, validate.near_duplicates_chance_margin "
        "20 x expected)")


def test_imagenet_1k_keeps_its_fixed_count_and_21k_scale_tolerates_its_chance_pairs():
    params = validate_section()
    d, max_pairs, margin = (params.near_duplicates_distance, params.near_duplicates_max_pairs,
                            params.near_duplicates_chance_margin)
    assert tolerance(1_281_167, 50_000, d, max_pairs, margin).tolerated == max_pairs == 1000
    at_21k = tolerance(12_500_000, 500_000, d, max_pairs, margin)  # ~13 M images, a 4 % holdout
    assert at_21k.tolerated > 7.7e4  # the chance pairs projected from real photos (issue 22)

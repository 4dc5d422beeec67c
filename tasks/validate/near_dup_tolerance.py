"""How many train/val near-duplicate pairs the `near_duplicates` check tolerates before it fails.

Unrelated images still fall within the distance now and then, and those chance pairs grow with train x val: the
same distance gives ~8e2 of them among ImageNet-1k's 6.4e10 comparisons and ~8e4 among ImageNet-21k's ~6e12. A
fixed count cannot fit both, so the tolerance scales with the comparisons: the pairs expected by chance between
unrelated uniform fingerprints (`chance_probability`: dct64-v2 sets exactly 32 of its 64 bits, so a distance is
even, 2j for j ones of one print where the other has zeros: sum over j <= d/2 of C(32, j)^2 / C(64, 32)), times
params validate.near_duplicates_chance_margin — real photos' fingerprints cluster, so more pairs than uniform ones
(~17x at distance 8: 10 pairs among 8e8 comparisons of 40,000 distinct real JPEGs, against 0.58 expected) — with
validate.near_duplicates_max_pairs as the floor (margin 0: that fixed count alone, as before)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

BITS, WEIGHT = 64, 32  # dct64-v2: 64-bit fingerprints, each with 32 bits set (above the median)


def chance_probability(distance: int, bits: int = BITS, weight: int = WEIGHT) -> float:
    """P(Hamming distance <= `distance`) between two independent uniform `bits`-bit fingerprints with `weight` bits
    set each (hypergeometric: the distance is 2j where j of one's set bits are unset in the other)."""
    ways = sum(math.comb(weight, j) * math.comb(bits - weight, j) for j in range(min(distance // 2, weight) + 1))
    return ways / math.comb(bits, weight)


@dataclass(frozen=True)
class Tolerance:
    """The chance level and the tolerated count of one train/val search."""

    comparisons: int  # train x val fingerprint pairs
    expected: float  # pairs expected by chance between uniform fingerprints
    tolerated: int  # max(max_pairs, floor(margin x expected))
    max_pairs: int
    margin: float

    def status(self, found: int) -> str:
        return "warn" if found <= self.tolerated else "fail"

    def describe(self) -> str:
        """The figures in words, for the check's message."""
        return (
            f"expected by chance: {self.expected:.3g} among {self.comparisons:.3g} train x val comparisons "
            f"(unrelated uniform fingerprints); tolerated: {self.tolerated} = max(params.yaml "
            f"validate.near_duplicates_max_pairs {self.max_pairs}, validate.near_duplicates_chance_margin "
            f"{self.margin:g} x expected)"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tolerance(train: int, val: int, distance: int, max_pairs: int, margin: float) -> Tolerance:
    """The tolerance of a search of `val` fingerprints against `train` ones within `distance` bits."""
    comparisons = train * val
    expected = comparisons * chance_probability(distance)
    return Tolerance(comparisons, expected, max(max_pairs, math.floor(margin * expected)), max_pairs, margin)

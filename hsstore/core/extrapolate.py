"""A population total from a simple random sample, with its normal-approximation interval (pure).

Planning a large data set tokenizes a seeded sample of its rows instead of all of them; the total tokens
are then ``rows x mean`` of the sample, and the interval is the mean's standard error (with the finite
population correction) times z. Rows the build drops (rejected, duplicate) count as 0 tokens, so the
total is of what the build keeps; duplicates of rows outside the sample are not seen (the total errs high).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959964  # two-sided 95 %


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float


def total_from_sample(values: Sequence[float], population: int, z: float = Z95, confidence: float = 0.95) -> Interval:
    """The total of ``values`` over a population of ``population`` items, ``values`` a random sample of it."""
    n = len(values)
    if n == 0:
        raise ValueError("an empty sample estimates nothing")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    fpc = (population - n) / (population - 1) if population > 1 else 0.0
    half = z * population * math.sqrt(var / n * max(0.0, fpc))
    est = population * mean
    return Interval(est, max(0.0, est - half), est + half, confidence)


def sample_indices(population: int, n: int, seed: int) -> list[int]:
    """``n`` distinct indices of ``range(population)`` drawn with ``seed``, ascending (all if n >= population)."""
    import random

    if n >= population:
        return list(range(population))
    return sorted(random.Random(seed).sample(range(population), n))

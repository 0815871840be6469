"""Splitting samples across ranks, and epoch orders: disjoint, complete, seeded (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def balanced_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Indices split into ``parts`` disjoint lists covering all, with near-equal token sums.

    Greedy longest-first onto the lightest part; each part keeps ascending index order.
    """
    loads = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        p = min(range(parts), key=lambda k: (loads[k], k))
        out[p].append(i)
        loads[p] += lengths[i]
    return [sorted(x) for x in out]


def epoch_order(n_blocks: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of block indices, the same for the same (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(n_blocks)


"""Token-budget batching: length-sorted batches whose padded size stays within a budget (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def token_budget_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped so that ``len(batch) * max(length in batch) <= budget``; longest first.

    Sorting by length keeps padding low; a sample longer than the budget gets a batch of its own.
    Returns: list of batches, each a list of indices into ``lengths``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        width = max(longest, n)
        if current and width * (len(current) + 1) > budget:
            batches.append(current)
            current, width = [], n
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches

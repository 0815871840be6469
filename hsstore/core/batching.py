"""Token-budget batching: length-sorted batches whose padded size stays within a budget (pure).

Padded lengths are bucketed (``padded_length``): a batch is padded to the next of at most 16 widths per
octave, each a multiple of 64. Every distinct batch shape makes the fla/triton kernels compile and
autotune once on a fresh host (hundreds of cache files, ~14 s per rank on an H200), so a build sees a
few dozen shapes instead of one per distinct longest sample; the price is under 6.25 % more padded
tokens per batch at worst (~3 % on average). The plan is made once for all ranks, so a sample is padded
the same way whatever the world size.
"""

from __future__ import annotations

from collections.abc import Sequence

PER_OCTAVE = 16
MIN_STEP = 64
POLICY = f"{PER_OCTAVE}-per-octave-multiple-of-{MIN_STEP}"  # recorded in provenance (environment.batching)


def padded_length(n: int, per_octave: int = PER_OCTAVE, min_step: int = MIN_STEP) -> int:
    """The width a batch whose longest sample has ``n`` tokens is padded to: ``n`` rounded up to a
    multiple of ``max(min_step, 2**floor(log2 n) / per_octave)``."""
    if n <= 0:
        return 0
    step = max(min_step, (1 << (int(n).bit_length() - 1)) // per_octave)
    return -(-int(n) // step) * step


def token_budget_batches(lengths: Sequence[int], budget: int, bucketed: bool = True) -> list[list[int]]:
    """Indices grouped so that ``len(batch) * width <= budget``, where width is the batch's padded
    length (``padded_length`` of its longest sample, or the longest itself if not ``bucketed``);
    longest first. Sorting by length keeps padding low; a sample too long for the budget gets a
    batch of its own. Returns: list of batches, each a list of indices into ``lengths``.
    """
    pad = padded_length if bucketed else (lambda n: n)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        w = max(width, pad(lengths[i]))
        if current and w * (len(current) + 1) > budget:
            batches.append(current)
            current, w = [], pad(lengths[i])
        current.append(i)
        width = w
    if current:
        batches.append(current)
    return batches


def batch_shapes(lengths: Sequence[int], batches: Sequence[Sequence[int]], bucketed: bool = True) -> set[tuple[int, int]]:
    """The distinct padded shapes ``(batch size, width)`` a plan runs (each compiles kernels once)."""
    pad = padded_length if bucketed else (lambda n: n)
    return {(len(b), pad(max(lengths[i] for i in b))) for b in batches if b}

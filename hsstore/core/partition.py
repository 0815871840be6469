"""Splitting work across ranks and DataLoader workers, and epoch orders: disjoint, complete, seeded.

Pure functions of numbers and arrays (no I/O, no torch.distributed), so every world shape can be tested
directly. The build side balances whole batches by tokens.

The read side (StreamingHiddenStateDataset). Each rank takes a contiguous run of the epoch order; inside a
rank, DataLoader worker ``w`` of ``W`` takes delivery units ``w, w + W, ...`` of that run (items, or whole
``batch_tokens`` batches cut from the run before it is shared out). The DataLoader asks its workers in turn,
so it yields exactly the rank's run in order, whatever the number of workers: the samples a training loop
has consumed are a prefix of the run, and a resume (the run without them) continues the uninterrupted
order, also with another number of workers. The cost is read locality: a worker reads every W-th sample of
a unit instead of one contiguous W-th of it. Inside a unit the order is shuffled anyway, so a worker never
read a unit front to back; it still reads only the rank's units (a rank's run is contiguous), each unit's
files are opened by W workers instead of about one, and the kernel's readahead follows each worker's own
samples. Contiguous runs per worker would make the loader's order depend on the worker count and leave a
resumed epoch in another order than an uninterrupted one. A DataLoader that batches items itself
(``batch_size`` > 1) with several workers takes that many items from one worker at a time: every sample
is still served once, but the resumed order can differ; ``batch_tokens`` batches (made by the dataset, with
``batch_size=None``) keep it exact.
"""

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


def epoch_sequence(unit_sizes: Sequence[int], seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Global sample order of one epoch: units in a seeded order, samples shuffled inside each unit.

    Returns: indices into the variant's key list, shape (sum(unit_sizes),).
    """
    starts = np.concatenate([[0], np.cumsum(unit_sizes)]).astype(np.int64)
    if not shuffle:
        return np.arange(starts[-1], dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 1])
    parts = []
    for u in epoch_order(len(unit_sizes), seed, epoch):
        idx = np.arange(starts[u], starts[u + 1], dtype=np.int64)
        rng.shuffle(idx)
        parts.append(idx)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def split_for(
    order: np.ndarray, world: int, rank: int, workers: int = 1, worker: int = 0, drop_remainder: bool = False
) -> np.ndarray:
    """The contiguous part of ``order`` that (``rank``, ``worker``) reads.

    Ranks take contiguous, near-equal runs (sizes differ by at most one); each rank's run is cut the same
    way among its DataLoader workers. ``drop_remainder`` first drops the last ``len(order) % world``
    entries so every rank gets the same count (they wait for a later epoch).
    Returns: a view of ``order``, shape (about len(order) / (world * workers),).
    """
    if not (0 <= rank < world and 0 <= worker < workers):
        raise ValueError(f"rank {rank} of {world} / worker {worker} of {workers} is out of range")
    if drop_remainder:
        order = order[: len(order) - len(order) % world]
    mine = np.array_split(order, world)[rank]  # (len(order) / world,)
    return np.array_split(mine, workers)[worker]  # (len(mine) / workers,)


def strided(seq: np.ndarray, parts: int, part: int) -> np.ndarray:
    """Entries ``part, part + parts, ...`` of ``seq``: a DataLoader's round-robin over ``parts`` workers that
    each take this share yields ``seq`` itself, in order (so a consumed prefix is a prefix of every share)."""
    if not 0 <= part < parts:
        raise ValueError(f"worker {part} of {parts} is out of range")
    return seq[part::parts]


def token_batches(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Greedy cut of a sequence into (start, end) runs of at most ``budget`` padded tokens (each run's count
    times its longest length); a sample longer than the budget is a batch of its own. The cut of a suffix
    that starts at a cut point is the rest of the whole sequence's cut, which keeps a resumed epoch's
    batches those of an uninterrupted one."""
    out: list[tuple[int, int]] = []
    start, width = 0, 0
    for i, n in enumerate(lengths):
        if i > start and max(width, n) * (i - start + 1) > budget:
            out.append((start, i))
            start, width = i, 0
        width = max(width, int(n))
    if len(lengths) > start:
        out.append((start, len(lengths)))
    return out


def worker_runs(
    seq: np.ndarray,
    workers: int,
    worker: int,
    marks: np.ndarray,
    lengths: Sequence[int] | None = None,
    budget: int | None = None,
) -> list[np.ndarray]:
    """What DataLoader worker ``worker`` of ``workers`` delivers of a rank's run ``seq``: its items (one run)
    or, with a token ``budget`` and the samples' ``lengths``, its batches (a run each), in turn with the
    other workers; samples ``marks`` (bool, by sample) calls consumed are left out."""
    if not budget:
        mine = strided(seq, workers, worker)
        return [mine[~marks[mine]]]
    runs = [seq[a:b] for a, b in token_batches(lengths or [], budget)[worker::workers]]
    return [r for r in (r[~marks[r]] for r in runs) if len(r)]

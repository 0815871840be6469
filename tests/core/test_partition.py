"""Partitioning and epoch orders (hsstore.core.partition): pure functions, tested over world shapes."""

from __future__ import annotations

import numpy as np
import pytest

from hsstore.core.partition import balanced_by_tokens, epoch_order, epoch_sequence, split_for

WORLDS = [(1, 1), (1, 3), (2, 1), (2, 2), (3, 4), (8, 2), (5, 7)]


@pytest.mark.parametrize("n", [0, 1, 7, 40, 101])
@pytest.mark.parametrize("world,workers", WORLDS)
def test_every_sample_once_in_contiguous_near_equal_parts(n: int, world: int, workers: int):
    order = np.random.default_rng(n).permutation(n)
    parts = [[split_for(order, world, r, workers, w) for w in range(workers)] for r in range(world)]
    flat = np.concatenate([p for rank in parts for p in rank]) if n else np.zeros(0, np.int64)
    assert np.array_equal(flat, order)  # disjoint, complete, and in epoch order: each part is one run
    per_rank = [sum(len(p) for p in rank) for rank in parts]
    assert max(per_rank) - min(per_rank) <= 1


@pytest.mark.parametrize("n", [1, 7, 40, 101])
@pytest.mark.parametrize("world,workers", WORLDS)
def test_drop_remainder_gives_every_rank_the_same_count(n: int, world: int, workers: int):
    order = np.arange(n)
    parts = [
        np.concatenate([split_for(order, world, r, workers, w, drop_remainder=True) for w in range(workers)])
        for r in range(world)
    ]
    assert len({len(p) for p in parts}) == 1
    assert np.array_equal(np.concatenate(parts), order[: n - n % world])


def test_out_of_range_rank_or_worker_is_refused():
    with pytest.raises(ValueError, match="rank 2 of 2"):
        split_for(np.arange(4), 2, 2)
    with pytest.raises(ValueError, match="worker 3 of 3"):
        split_for(np.arange(4), 1, 0, 3, 3)


@pytest.mark.parametrize("sizes", [[5, 3, 4], [1], [10, 1, 1, 7], []])
def test_epoch_sequence_is_seeded_and_reads_each_unit_as_one_run(sizes: list[int]):
    a, b = epoch_sequence(sizes, 1, 0, True), epoch_sequence(sizes, 1, 0, True)
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(sum(sizes)))
    unit = np.repeat(np.arange(len(sizes)), sizes)[a]
    assert (np.diff(unit) != 0).sum() == max(0, len(sizes) - 1)
    assert np.array_equal(epoch_sequence(sizes, 1, 0, False), np.arange(sum(sizes)))


def test_epochs_and_seeds_change_the_order():
    sizes = [6, 5, 7, 4]
    base = epoch_sequence(sizes, 1, 0, True)
    assert not np.array_equal(base, epoch_sequence(sizes, 1, 1, True))
    assert not np.array_equal(base, epoch_sequence(sizes, 2, 0, True))
    assert sorted(epoch_order(9, 3, 4).tolist()) == list(range(9))


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_balanced_by_tokens_is_disjoint_complete_and_balanced(parts: int):
    lengths = np.random.default_rng(parts).integers(1, 4096, 200).tolist()
    out = balanced_by_tokens(lengths, parts)
    flat = sorted(i for p in out for i in p)
    assert flat == list(range(len(lengths))) and all(p == sorted(p) for p in out)
    loads = [sum(lengths[i] for i in p) for p in out]
    # greedy longest-first onto the lightest part: parts differ by at most the longest item
    assert max(loads) - min(loads) <= max(lengths)

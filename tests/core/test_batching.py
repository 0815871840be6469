"""Token-budget batching (hsstore.core.batching): a pure planner, tested directly, with and without
bucketed padded lengths."""

from __future__ import annotations

import numpy as np
import pytest

from hsstore.core.batching import PER_OCTAVE, batch_shapes, padded_length, token_budget_batches


@pytest.mark.parametrize("budget", [16, 100, 4096])
@pytest.mark.parametrize("seed", range(4))
def test_batches_cover_every_index_once_within_the_budget(budget: int, seed: int):
    lengths = np.random.default_rng(seed).integers(1, 300, 97).tolist()
    batches = token_budget_batches(lengths, budget, bucketed=False)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= budget or len(b) == 1  # a sample longer than the budget runs alone


def test_longest_first_and_deterministic():
    lengths = [5, 9, 9, 1, 7]
    batches = token_budget_batches(lengths, 18, bucketed=False)
    assert batches == token_budget_batches(lengths, 18, bucketed=False)
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)
    assert batches[0] == [1, 2]  # ties keep index order


def test_empty_input_gives_no_batches():
    assert token_budget_batches([], 10) == []


@pytest.mark.parametrize("n", [1, 17, 63, 64, 65, 100, 511, 512, 513, 1000, 2047, 2048, 2049, 5000, 40000])
def test_padded_length_is_a_bounded_round_up_to_a_multiple_of_64(n: int) -> None:
    w = padded_length(n)
    assert w >= n and w % 64 == 0
    assert w - n < max(64, n / PER_OCTAVE)  # under one step: at most 1/16 of the length above 1024


def test_at_most_sixteen_widths_per_octave() -> None:
    widths = {padded_length(n) for n in range(1025, 2049)}
    assert len(widths) <= PER_OCTAVE
    widths = {padded_length(n) for n in range(1, 32769)}
    assert len(widths) <= 16 + 5 * PER_OCTAVE + 1  # multiples of 64 up to 1024, then 16 per octave


@pytest.mark.parametrize("budget", [512, 4096, 16384])
@pytest.mark.parametrize("bucketed", [True, False])
def test_every_sample_once_within_budget_longest_first(budget: int, bucketed: bool) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, 500).tolist()
    batches = token_budget_batches(lengths, budget, bucketed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    pad = padded_length if bucketed else (lambda n: n)
    for b in batches:
        width = pad(max(lengths[i] for i in b))
        assert len(b) == 1 or len(b) * width <= budget
        assert lengths[b[0]] == max(lengths[i] for i in b)
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)


def test_bucketing_bounds_the_number_of_batch_shapes() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1024, 2049, 2000).tolist()
    plain = batch_shapes(lengths, token_budget_batches(lengths, 16384, False), False)
    bucketed = batch_shapes(lengths, token_budget_batches(lengths, 16384, True), True)
    assert len(bucketed) <= 2 * PER_OCTAVE + 2 < len(plain)


def test_bucketed_plan_is_deterministic_and_pads_to_the_bucket() -> None:
    lengths = [5, 900, 77, 900, 1500, 3]
    batches = token_budget_batches(lengths, 2048)
    assert batches == token_budget_batches(list(lengths), 2048)
    # 1500 pads to 1536 (alone in 2048); 900 to 960 (two: 1920); 77 to 128 (three: 384)
    assert batches == [[4], [1, 3], [2, 0, 5]]

"""Token-budget batching (hsstore.core.batching): a pure planner, tested directly."""

from __future__ import annotations

import numpy as np
import pytest

from hsstore.core.batching import token_budget_batches


@pytest.mark.parametrize("budget", [16, 100, 4096])
@pytest.mark.parametrize("seed", range(4))
def test_batches_cover_every_index_once_within_the_budget(budget: int, seed: int):
    lengths = np.random.default_rng(seed).integers(1, 300, 97).tolist()
    batches = token_budget_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= budget or len(b) == 1  # a sample longer than the budget runs alone


def test_longest_first_and_deterministic():
    lengths = [5, 9, 9, 1, 7]
    batches = token_budget_batches(lengths, 18)
    assert batches == token_budget_batches(lengths, 18)
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)
    assert batches[0] == [1, 2]  # ties keep index order


def test_empty_input_gives_no_batches():
    assert token_budget_batches([], 10) == []

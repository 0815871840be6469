"""Sampled diffs (--samples / --fraction): a seeded, length-stratified choice of shared samples and
intervals that cover the full diff's values on real stores, with the same verdict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli

from hsstore.compare.diff import DiffRequest, run_diff
from hsstore.compare.sampling import choose, replicate_weights, t_quantile


def _targets(store: Path) -> tuple[str, str, str]:
    return (f"{store}#attention=eager,dtype=bf16", f"{store}#attention=sdpa,dtype=bf16", f"{store}#dtype=fp32")


def test_sampled_interval_covers_full_values_and_verdict_matches(attn_store: Path):
    a, b, c = _targets(attn_store)
    full = run_diff(DiffRequest(a_target=a, b_target=b, floor=c))
    assert full.verdict_kind in ("within_noise", "beyond_noise"), full.verdict
    sampled = run_diff(DiffRequest(a_target=a, b_target=b, floor=c, samples=16, seed=3))
    assert sampled.sampling.samples == 16 and sampled.sampling.population == full.shared_samples == 40
    assert sampled.tokens < full.tokens
    assert sampled.verdict_kind == full.verdict_kind
    assert [L.layer for L in sampled.layers] == [L.layer for L in full.layers] == [0, 1, 3]
    for F, S in zip(full.layers, sampled.layers):
        for name in ("rel_l2", "mean_abs", "cos_mean", "floor_ratio"):
            lo, hi = S.ci[name]
            assert lo <= getattr(F, name) <= hi, (F.layer, name, getattr(F, name), (lo, hi))
        assert S.max_abs <= F.max_abs and S.cos_min >= F.cos_min  # bounds from one side


def test_sampled_cli_says_it_was_sampled(attn_store: Path):
    a, b, c = _targets(attn_store)
    r = run_cli("diff", a, b, "--floor", c, "--fraction", "0.25", "--seed", "7")
    assert r.returncode == 0, r.stderr
    assert "SAMPLED: 10 of 40 shared samples" in r.stdout and "seed 7" in r.stdout
    j = run_cli("diff", a, b, "--floor", c, "--fraction", "0.25", "--seed", "7", "--json", "-")
    rep = json.loads(j.stdout)
    assert rep["sampling"]["seed"] == 7 and "bootstrap" in rep["sampling"]["interval"]
    assert [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    assert all(len(L["ci"]["rel_l2"]) == 2 for L in rep["layers"])


def test_whole_population_sampled_equals_full_diff(tiny_store: Path):
    a, b = f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32"
    full = run_diff(DiffRequest(a_target=a, b_target=b))
    every = run_diff(DiffRequest(a_target=a, b_target=b, fraction=1.0))
    assert [L.layer for L in every.layers] == [L.layer for L in full.layers] == [0, 1, 3]
    for F, S in zip(full.layers, every.layers):
        assert S.rel_l2 == pytest.approx(F.rel_l2, rel=1e-12) and S.bit_exact == pytest.approx(F.bit_exact)
        lo, hi = S.ci["rel_l2"]
        assert lo == pytest.approx(hi, rel=1e-9)  # finite-population correction: no uncertainty left


@pytest.mark.parametrize(
    "args",
    [
        ["--samples", "0"],
        ["--fraction", "1.5"],
        ["--samples", "3", "--fraction", "0.1"],
        ["--samples", "3", "--confidence", "1"],
    ],
)
def test_bad_sampling_options_exit_2(tiny_store: Path, args: list[str]):
    r = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", *args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_choice_is_seeded_stratified_and_proportional():
    lengths = [10] * 50 + [1000] * 50
    keys = [f"k{i:03d}" for i in range(100)]
    one, same, other = (
        choose(lengths, keys, 20, seed=1),
        choose(lengths, keys, 20, seed=1),
        choose(lengths, keys, 20, 2),
    )
    assert one.indices.tolist() == same.indices.tolist() != other.indices.tolist()
    assert len(set(one.indices.tolist())) == 20 and one.indices.tolist() == sorted(one.indices.tolist())
    short = sum(1 for i in one.indices if lengths[i] == 10)
    assert short == 10  # half short, half long: proportional, not left to chance
    assert one.weights.sum() == pytest.approx(100)  # the weights expand the sample to the population
    # the choice depends on the set of keys, not on their order
    perm = np.random.default_rng(0).permutation(100)
    shuffled = choose([lengths[i] for i in perm], [keys[i] for i in perm], 20, seed=1)
    assert sorted(keys[perm[i]] for i in shuffled.indices) == sorted(keys[i] for i in one.indices)


def test_bootstrap_weights_keep_the_population_total_on_average():
    choice = choose(list(range(200)), [str(i) for i in range(200)], 40, seed=0)
    w = replicate_weights(choice, 2000, seed=0)
    assert (w >= 0).all()
    assert w.sum(axis=1).mean() == pytest.approx(200, rel=0.01)


def test_t_quantile_matches_tables():
    assert t_quantile(0.975, 5) == pytest.approx(2.571, abs=0.01)
    assert t_quantile(0.975, 30) == pytest.approx(2.042, abs=0.002)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.960, abs=0.001)


def test_a_sampled_diff_with_a_floor_on_fewer_samples_computes_each_sample_as_the_full_diff(
    attn_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A floor that holds fewer samples than A and B share: the full diff compares A with B alone (the floor in a
    pass of its own), the sampled one A with B and C in one pass. Each chose its arithmetic from its own pass's
    work, so around the bar they took different paths, and the sampled min cos fell below the full one."""
    import shutil

    from hsstore.compare import diff
    from hsstore.compare.diff import open_target, shared_keys

    store = tmp_path / "s.zarr"
    shutil.copytree(attn_store, store)
    a, b, c = _targets(store)
    floor = open_target(c)
    next(iter(sorted((store / "variants" / floor.id / "commits").glob("*.json")))).unlink()  # a unit fewer
    ra, rb = open_target(a), open_target(b)
    keys = shared_keys(ra, rb)
    assert len(shared_keys(ra, open_target(c))) < len(keys)
    ab_pairs = 2 * sum(ra.refs[k].length for k in keys) * ra.record.hidden_size * len(ra.record.all_layers)
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", int(ab_pairs * 1.2))  # A-B alone under the bar, with C over
    full = run_diff(DiffRequest(a_target=a, b_target=b, floor=c))
    sampled = run_diff(DiffRequest(a_target=a, b_target=b, floor=c, fraction=1.0, seed=0))
    for F, S in zip(full.layers, sampled.layers):
        assert S.max_abs <= F.max_abs and S.cos_min >= F.cos_min, (F.layer, F.cos_min, S.cos_min)
    # the same sample, the same numbers to the bit (on two paths they differed by ~1e-12)
    in_full = {w.key: w.rel_l2 for w in full.worst_samples}
    both = [(w.key, w.rel_l2, in_full[w.key]) for w in sampled.worst_samples if w.key in in_full]
    assert both and all(x == y for _, x, y in both), both

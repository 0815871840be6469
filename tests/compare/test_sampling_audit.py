"""Which samples an audit checks and what they bound: a seeded choice (``--samples``/``--fraction``), every
sample, or the samples a user names (``--keys``, e.g. the ones ``verify`` or training flagged) — and the
bound said accordingly: a rate bound for a random choice, the exact rate when every sample was checked,
none for named samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import run_cli
from interop_damage import damage, sample_file, sidecar, subset

from hsstore import Store
from hsstore.compare.sampling import upper_bound
from hsstore.interop.exporter import ExportRequest, export_cache

MODEL = "builtin:tiny-qwen3_5"
N, BAD = 6, 3  # samples in the cache; how many of them hold NaN states in the target


def _nan_rows(a: torch.Tensor, t: torch.Tensor) -> tuple:
    t = t.clone()
    t[2:4] = float("nan")
    return a, t


@pytest.fixture(scope="module")
def nan_cache(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], list[str]]:
    """A Model-Optimizer-layout cache of the N shortest samples, BAD of them with NaN target rows (the same
    defect in several samples), imported as a user would: (store, bad keys, clean keys)."""
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    picks = sorted(enumerate(r.keys), key=lambda ik: (r.refs[ik[1]].length, ik[1]))[:N]
    root = tmp_path_factory.mktemp("nan-cache")
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "modelopt", str(root / "full")))
    folder = subset("modelopt", root / "full", root / "modelopt", picks)
    sidecar("modelopt", folder).unlink()
    bad = [k for _, k in picks[1::2]][:BAD]
    for i, k in picks:
        if k in bad:
            damage("modelopt", sample_file("modelopt", folder, i, k), _nan_rows)
    store = str(root / "s.zarr")
    r = run_cli(
        "import",
        "modelopt",
        str(folder),
        "--store",
        store,
        "--tokenizer",
        MODEL,
        "--model",
        MODEL,
        "--layers",
        "0,1,3",
        "--capture",
        "output",
        "--allow-unhealthy",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return store, bad, [k for _, k in picks if k not in bad]


def _check(*args: str) -> tuple[int, dict, str]:
    r = run_cli("check", MODEL, *args, "--json", "-")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


def test_every_sample_checked_gives_the_exact_rate_and_counts_each_sample(nan_cache):
    store, bad, _ = nan_cache
    code, rep, _ = _check(store, "--fraction", "1")
    assert code == 1 and rep["samples"] == rep["population"] == N
    assert rep["defects"] == {"nan": BAD} and rep["defective_samples"] == BAD
    assert rep["verdict"].startswith(f"DEFECTS in {BAD} of {N} checked samples: nan ({BAD} samples, layer 3)")
    assert {f["key"] for f in rep["findings"]} == set(bad)
    assert rep["defect_rate_upper"] == pytest.approx(BAD / N)  # no sampling: the rate itself
    assert f"every one of the {N} samples" in rep["bound"] and f"{BAD / N:.3g}" in rep["bound"], rep["bound"]


def test_named_samples_are_checked_and_bound_nothing(nan_cache):
    store, bad, clean = nan_cache
    code, rep, _ = _check(store, "--keys", f"{bad[-1][:12]},{clean[0]}")
    assert code == 1 and set(rep["keys"]) == {bad[-1], clean[0]} and rep["defects"] == {"nan": 1}
    assert rep["defect_rate_upper"] is None and "named (--keys), not drawn at random" in rep["bound"], rep["bound"]
    code, rep, _ = _check(store, "--keys", clean[0])
    assert code == 0 and rep["keys"] == [clean[0]] and rep["verdict"].startswith("AGREES")


def test_samples_1_checks_one_sample(nan_cache):
    store, _, _ = nan_cache
    code, rep, _ = _check(store, "--samples", "1")
    assert rep["samples"] == 1 and len(rep["sample_verdicts"]) == 1
    assert rep["defect_rate_upper"] == pytest.approx(upper_bound(rep["defective_samples"], 1))


@pytest.mark.parametrize(
    "keys, words",
    [("ffffffffffff", "no sample of variant .* has a key starting with 'ffffffffffff'"), ("", "--keys is empty")],
)
def test_a_key_that_names_no_sample_is_one_line_exit_2(nan_cache, keys: str, words: str):
    import re

    store, _, _ = nan_cache
    code, _, err = _check(store, "--keys", keys)
    lines = [e for e in err.splitlines() if e.strip() and not e.startswith("[transformers]")]
    assert code == 2 and len(lines) == 1 and re.search(words, lines[0]), err


def test_an_ambiguous_key_prefix_is_one_line_exit_2(tiny_store: Path):
    s = Store.open(tiny_store)
    firsts = [k[0] for k in s.reader(s.select("dtype=bf16")).keys]  # 40 keys, 16 hex digits: two share one
    shared = next(c for c in firsts if firsts.count(c) > 1)
    code, _, err = _check(f"{tiny_store}#dtype=bf16", "--keys", shared)
    assert code == 2 and f"key prefix '{shared}' matches {firsts.count(shared)} samples" in err, err


def test_keys_and_samples_do_not_combine(nan_cache):
    store, bad, _ = nan_cache
    code, _, err = _check(store, "--keys", bad[0], "--samples", "2")
    assert code == 2 and "--keys names the samples: leave out --samples and --fraction" in err, err

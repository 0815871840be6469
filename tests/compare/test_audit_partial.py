"""Defects that hide behind others: several in one layer (NaN rows in a target that also leaks into the aux
layers; zero rows and noise elsewhere in the rows), a shift by more than a few tokens, and states of a
suffix written from row 0 with a zero tail (a prefix-cache hit, padded at the end). Each is seeded into a
foreign cache of two peer layouts (hsstore exports with their export record removed), imported with the
flags a user passes, and audited: every defect named on its layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import run_cli
from interop_damage import damage, sample_file, sidecar, subset

from hsstore import Store
from hsstore.interop.exporter import ExportRequest, export_cache

MODEL = "builtin:tiny-qwen3_5"
AUX0, AUX1, TARGET = 0, 1, 3
ALL = (AUX0, AUX1, TARGET)
STATED = {"specforge": ("0,1,3", "output"), "speculators": ("1,2,4", "input")}


def _nan_target_leaking(a: torch.Tensor, t: torch.Tensor) -> tuple:
    t = t.clone()
    t[3:5] = float("nan")
    a = a.clone()
    a[:, AUX1] = t
    return a, t


def _zero_rows_and_noise(a: torch.Tensor, t: torch.Tensor) -> tuple:
    t = t.clone()
    t[10:13] = 0.0
    g = torch.Generator().manual_seed(0)
    t[30:40] = (t[30:40].float() + 0.3 * t.float().std() * torch.randn(10, t.shape[1], generator=g)).to(t.dtype)
    return a, t


def _suffix_from_row_0(k: int):
    def change(a: torch.Tensor, t: torch.Tensor) -> tuple:
        a2, t2 = torch.zeros_like(a), torch.zeros_like(t)
        a2[:-k], t2[:-k] = a[k:], t[k:]
        return a2, t2

    return change


# defect -> (the damage, {layer: [kinds named on it, in order]}, {layer: facts of its first finding})
SEEDED = {
    "nan_target_leaking_into_aux": (
        _nan_target_leaking,
        {AUX1: ["nan", "aux_equals_target"], TARGET: ["nan"]},
        {AUX1: {"rows": [3, 4]}, TARGET: {"rows": [3, 4]}},
    ),
    "zero_rows_and_noise_in_one_layer": (
        _zero_rows_and_noise,
        {TARGET: ["all_zero", "beyond_noise"]},
        {TARGET: {"rows": [10, 11, 12]}},
    ),
    "shift_by_7": (
        lambda a, t: (torch.roll(a, 7, 0), torch.roll(t, 7, 0)),
        {L: ["token_shift"] for L in ALL},
        {L: {"match": 7} for L in ALL},
    ),
    "suffix_written_from_row_0": (
        _suffix_from_row_0(9),
        {L: ["suffix_states"] for L in ALL},
        {L: {"match": -9} for L in ALL},
    ),
}


@pytest.fixture(scope="module", params=sorted(STATED))
def audited(request: pytest.FixtureRequest, tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """Each defect seeded into its own sample of a foreign cache (the shortest samples; one left clean),
    imported with the user's statement, every sample audited: (format, report, defect -> key, clean key)."""
    fmt = request.param
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    picks = sorted(enumerate(r.keys), key=lambda ik: (r.refs[ik[1]].length, ik[1]))[: len(SEEDED) + 1]
    root = tmp_path_factory.mktemp(f"partial-{fmt}")
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", fmt, str(root / "full")))
    folder = subset(fmt, root / "full", root / fmt, picks)
    sidecar(fmt, folder).unlink(missing_ok=True)
    plan = dict(zip(SEEDED, picks[1:]))
    for name, (index, key) in plan.items():
        damage(fmt, sample_file(fmt, folder, index, key), SEEDED[name][0])
    store = str(root / "s.zarr")
    layers, capture = STATED[fmt]
    res = run_cli(
        "import",
        fmt,
        str(folder),
        "--store",
        store,
        "--tokenizer",
        MODEL,
        "--model",
        MODEL,
        "--layers",
        layers,
        "--capture",
        capture,
        "--allow-unhealthy",
        "--quiet",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_cli("check", MODEL, store, "--fraction", "1", "--json", "-")
    assert res.returncode == 1, res.stderr[-2000:]
    return fmt, json.loads(res.stdout), {n: k for n, (_, k) in plan.items()}, picks[0][1]


@pytest.mark.parametrize("defect", sorted(SEEDED))
def test_every_defect_of_a_layer_is_named(audited: tuple, defect: str):
    fmt, rep, plan, _ = audited
    key = plan[defect]
    _, want, facts = SEEDED[defect]
    got: dict[int, list[dict]] = {}
    for f in rep["findings"]:
        if f["key"] == key:
            got.setdefault(f["layer"], []).append(f)
    assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == want, (fmt, defect, got)
    for L, wanted in facts.items():
        for name, value in wanted.items():
            assert got[L][0][name] == value, (fmt, defect, got[L][0])
    verdict = next(v for v in rep["sample_verdicts"] if v["key"] == key)
    assert {int(L): c for L, c in verdict["layers"].items() if int(L) in want} == {
        L: "+".join(kinds) for L, kinds in want.items()
    }, verdict
    assert set(verdict["verdict"].split("+")) == {k for kinds in want.values() for k in kinds}


def test_the_summary_counts_each_sample_once_per_class(audited: tuple):
    _, rep, plan, clean = audited
    assert rep["defective_samples"] == len(plan)
    for kind in {k for _, want, _ in SEEDED.values() for kinds in want.values() for k in kinds}:
        assert rep["defects"][kind] == sum(
            1 for _, want, _ in SEEDED.values() if any(kind in kinds for kinds in want.values())
        ), (kind, rep["defects"])
    assert next(v for v in rep["sample_verdicts"] if v["key"] == clean)["verdict"] in ("bit_exact", "within_noise")


@pytest.mark.parametrize("fmt", sorted(STATED))
def test_more_or_fewer_rows_than_tokens_never_enter_and_the_audit_says_so(fmt: str, tiny_store: Path, tmp_path: Path):
    """States of a suffix only (prefix caching: fewer rows than tokens) and one row too many: the import
    names each file and stops (exit 2); with --skip-bad it counts them, and the audit of what entered says
    that it cannot judge them."""
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    picks = sorted(enumerate(r.keys), key=lambda ik: (r.refs[ik[1]].length, ik[1]))[:3]
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", fmt, str(tmp_path / "full")))
    folder = subset(fmt, tmp_path / "full", tmp_path / fmt, picks)
    sidecar(fmt, folder).unlink(missing_ok=True)
    (i1, k1), (i2, k2) = picks[1], picks[2]
    damage(fmt, sample_file(fmt, folder, i1, k1), lambda a, t: (a[5:], t[5:]))  # a suffix's states
    damage(fmt, sample_file(fmt, folder, i2, k2), lambda a, t: (torch.cat([a, a[-1:]]), torch.cat([t, t[-1:]])))
    layers, capture = STATED[fmt]
    args = [
        "import",
        fmt,
        str(folder),
        "--tokenizer",
        MODEL,
        "--model",
        MODEL,
        "--layers",
        layers,
        "--capture",
        capture,
        "--quiet",
    ]
    res = run_cli(*args, "--store", str(tmp_path / "refused.zarr"))
    err = [e for e in res.stderr.splitlines() if e.startswith("error:")]
    assert res.returncode == 2 and len(err) == 1 and "has shape" in err[0] and "expected [" in err[0], res.stderr
    store = str(tmp_path / "s.zarr")
    res = run_cli(*args, "--store", store, "--skip-bad", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["skipped_bad"] == 2, res.stderr[-2000:]
    res = run_cli("check", MODEL, store, "--json", "-")
    rep = json.loads(res.stdout)
    assert res.returncode == 0 and rep["keys"] == [picks[0][1]], rep["verdict"]
    assert any("left out 2 file(s)" in n and "do not line up with their tokens" in n for n in rep["notes"]), rep[
        "notes"
    ]

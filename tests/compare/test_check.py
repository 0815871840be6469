"""hsstore check: a model in this process recomputes stored samples in their recorded batches and
matches the store bit-exactly on the CPU (fp32 and bf16), and reports a real divergence when the
model's weights differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import FLA_INSTALLED, LAYERS, make_samples, make_states, provenance, run_cli

from hsstore import Store
from hsstore.compare.check import batch_plan, run_check
from hsstore.core.errors import BadInput
from hsstore.storage.writer import UnitWriter


def _check(*args: str) -> tuple[int, dict, str]:
    r = run_cli("check", *args, "--json", "-")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}), r.stderr


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_check_matches_the_store_bit_exactly_on_cpu(tiny_store: Path, dtype: str):
    code, rep, err = _check("builtin:tiny-qwen3_5", f"{tiny_store}#dtype={dtype}", "--samples", "6", "--seed", "1")
    assert code == 0, err
    assert rep["verdict_kind"] == "identical" and rep["same_model"] and rep["samples"] == 6
    assert [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    assert all(L["bit_exact"] == 1.0 and L["rel_l2"] == 0.0 for L in rep["layers"])
    assert rep["environment_differences"] == []
    assert 1 <= rep["batches"] <= 6 and "padded" in rep["batching"]


def _perturbed_model(tmp: Path, scale: float = 1.01) -> Path:
    """A save_pretrained copy of builtin:tiny-qwen3_5 (same seed) with decoder layer 2's MLP scaled."""
    from transformers import AutoModelForCausalLM

    from hsstore.capture.model.builtin import builtin_config, builtin_tokenizer

    tok = builtin_tokenizer()
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(builtin_config("tiny-qwen3_5", {}, len(tok)), dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.mul_(scale)
    d = tmp / "perturbed"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_check_reports_a_real_divergence_when_weights_differ(tiny_store: Path, tmp_path: Path):
    model = _perturbed_model(tmp_path)
    code, rep, err = _check(str(model), f"{tiny_store}#dtype=fp32", "--samples", "4")
    assert code == 1, err
    assert "do not match the store" in err
    assert not rep["same_model"] and any("other weights" in n for n in rep["notes"])
    by_layer = {L["layer"]: L for L in rep["layers"]}
    # layers before the changed one are untouched, the ones after it diverge far beyond fp32 roundoff
    assert by_layer[0]["bit_exact"] == 1.0 and by_layer[1]["bit_exact"] == 1.0
    assert by_layer[3]["rel_l2"] > 1e-4 and by_layer[3]["bit_exact"] < 0.5
    assert rep["verdict_kind"] == "differs"


def test_check_with_other_weights_says_so_first_and_advises_the_right_model(tiny_store: Path, tmp_path: Path):
    """Weights whose fingerprint is not the recorded one: the note comes before the recompute (the first
    line on stderr, not after it ran), and the verdict advises the model the variant was built from, not
    --floor (a floor cannot make other weights agree). Before, it advised --floor, after the recompute."""
    code, rep, err = _check(str(_perturbed_model(tmp_path)), f"{tiny_store}#dtype=fp32", "--samples", "2")
    assert code == 1 and err.splitlines()[0].startswith("note: the model's fingerprint"), err
    assert "pass the model the variant was built from" in rep["verdict"] and "--floor" not in rep["verdict"]


def test_check_with_a_floor_judges_the_divergence(tiny_store: Path, tmp_path: Path):
    """bf16 states against the bf16-vs-fp32 floor: a 1% change of one MLP hides in bf16 noise here,
    a 50% change does not."""
    small = _check(
        str(_perturbed_model(tmp_path / "small")),
        f"{tiny_store}#dtype=bf16",
        "--floor",
        f"{tiny_store}#dtype=fp32",
        "--samples",
        "3",
    )
    assert small[0] == 0 and small[1]["verdict_kind"] == "within_noise", small[2]
    model = _perturbed_model(tmp_path, 1.5)
    code, rep, err = _check(
        str(model), f"{tiny_store}#dtype=bf16", "--floor", f"{tiny_store}#dtype=fp32", "--samples", "3"
    )
    assert code == 1, err
    assert rep["verdict_kind"] == "beyond_noise" and rep["floor_layers"]
    worst = max(rep["layers"], key=lambda L: L["floor_ratio"])
    assert worst["layer"] == 3 and worst["floor_ratio"] > 2


def test_batch_plan_is_the_builds(tiny_store: Path):
    """Every committed unit holds whole batches of the rebuilt plan, in its order (the build writes
    batch by batch)."""
    s = Store.open(tiny_store)
    reader = s.reader(s.select("dtype=bf16"))
    plan = batch_plan(reader)
    flat = [k for b in plan.batches for k in b]
    assert sorted(flat) == sorted(reader.keys) and flat == reader.keys
    lengths = [[reader.refs[k].length for k in b] for b in plan.batches]
    assert all(x == sorted(x, reverse=True) for x in lengths)
    assert plan.bucketed and plan.token_budget == 2048


def _variant_recording(tmp: Path, kernels: dict, backend: str = "torch") -> str:
    s = Store.create(tmp / "k.zarr")
    prov = provenance("bf16", backend=backend)
    prov["environment"]["kernels"] = kernels
    prov["environment"]["batching"] = {
        "padding_side": "right",
        "token_budget": 512,
        "attention_mask": True,
        "order": "length-descending",
    }
    vid = s.create_variant(prov, LAYERS, 64, "bf16", "zstd", 64)
    samples = make_samples([8, 12])
    UnitWriter(s, vid).write(samples, make_states(samples, 64, "bf16", [0, 1, 2]))
    return f"{tmp / 'k.zarr'}#{vid}"


def test_check_refuses_kernels_this_process_does_not_bind(tmp_path: Path):
    target = _variant_recording(
        tmp_path, {"chunk_gated_delta_rule": "fla", "causal_conv1d": "causal_conv1d", "attention": "sdpa"}
    )
    with pytest.raises(
        BadInput, match="binds other kernels than variant .*chunk_gated_delta_rule: 'torch' here, 'fla' recorded"
    ):
        run_check("builtin:tiny-qwen3_5", target, samples=1)


@pytest.mark.process  # a fresh process binding the recorded backend: this one binds torch (conftest)
@pytest.mark.skipif(FLA_INSTALLED, reason="refusal of a missing fla is only observable where fla is not installed")
def test_check_refuses_a_backend_whose_kernels_are_missing(tmp_path: Path):
    target = _variant_recording(
        tmp_path,
        {"chunk_gated_delta_rule": "fla", "causal_conv1d": "causal_conv1d", "attention": "sdpa"},
        backend="fla",
    )
    r = run_cli("check", "builtin:tiny-qwen3_5", target, process=True)
    assert r.returncode == 2 and "backend 'fla' needs the flash-linear-attention kernels" in r.stderr


def test_check_with_another_builtin_model_says_the_model_differs(tiny_store: Path):
    """A model of another architecture binds other kernels too; the refusal names the models, not the kernels."""
    r = run_cli("check", "builtin:tiny-llama", f"{tiny_store}#dtype=bf16", "--samples", "2")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-2000:]
    rec = Store.open(tiny_store).reader(Store.open(tiny_store).select("dtype=bf16")).record.prov.recipe.model
    assert "another model" in errors[0] and "builtin:tiny-llama" in errors[0] and "builtin:tiny-qwen3_5" in errors[0]
    assert rec.fingerprint in errors[0] and "fresh process" not in errors[0]


def test_check_and_audit_of_a_few_samples_do_not_load_the_compiled_loops(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch
):
    """numba's loops cost ~1 s to load in a process and pay only past 2^30 bf16 pairs a thread (diff's
    gate, hsstore.compare.diff.use_compiled); check and audit loaded them for any sample count. A check or
    audit of a few samples takes torch's ops (the same numbers, tests/compare/test_kernel.py)."""
    from hsstore.compare import kernel
    from hsstore.compare.audit import AuditRequest, run_audit

    loaded: list[bool] = []
    real = kernel.compiled_kernel
    monkeypatch.setattr(kernel, "compiled_kernel", lambda: loaded.append(True) or real())
    assert run_check("builtin:tiny-qwen3_5", f"{tiny_store}#dtype=bf16", samples=2).verdict_kind == "identical"
    assert run_audit(AuditRequest(model="builtin:tiny-qwen3_5", target=f"{tiny_store}#dtype=bf16", samples=2))
    assert not loaded


def test_a_check_with_a_floor_counts_both_comparisons_toward_the_compiled_loops(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch
):
    """A check with a floor compares twice (live against stored, stored against the floor): the bar for loading
    the compiled loops (hsstore.compare.diff.use_compiled) counts both, as the diff counts B and its floor."""
    from hsstore.compare import diff, kernel
    from hsstore.compare.check import compare_live

    loaded: list[bool] = []
    real = kernel.compiled_kernel
    monkeypatch.setattr(kernel, "compiled_kernel", lambda: loaded.append(True) or real())
    s = Store.open(tiny_store)
    bf16, fp32 = (s.reader(s.select(f"dtype={d}")) for d in ("bf16", "fp32"))
    keys, layers = bf16.keys[:2], bf16.record.all_layers
    live = {k: bf16.read_layers(bf16.refs[k], layers) for k in keys}
    pairs = sum(bf16.refs[k].length for k in keys) * bf16.record.hidden_size * len(layers)
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", 3 * pairs)  # bf16 live vs stored: ULPs too (2x), the floor 1x
    compare_live(bf16, live, keys, layers)
    assert not loaded
    totals, ftotals = compare_live(bf16, live, keys, layers, floor=fp32)
    assert loaded and ftotals is not None

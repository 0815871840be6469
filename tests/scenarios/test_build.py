"""``hsstore build`` end to end through the real CLI (in this process; backend isolation in subprocesses), on
the tiny builtin models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import REPO, assert_bit_exact, run_cli, write_manifest

from hsstore import HiddenStateDataset, Store
from hsstore.capture.model.spec import ModelSpec

STANDIN = str(REPO / "tests" / "standin")


def test_tiny_build_records_bound_kernels_and_rerun_writes_nothing(tiny_store: Path, tmp_path: Path):
    shutil.copytree(tiny_store.parent, tmp_path / "tiny")  # a rerun appends build records: not in the shared store
    tiny_store = tmp_path / "tiny" / "store.zarr"
    info = json.loads(run_cli("info", str(tiny_store), "--json").stdout)
    assert sorted(v["provenance"]["environment"]["dtype"] for v in info["variants"]) == ["bf16", "fp32"]
    for v in info["variants"]:
        env = v["provenance"]["environment"]
        assert env["kernels"] == {"chunk_gated_delta_rule": "torch", "causal_conv1d": "torch", "attention": "sdpa"}
        assert v["n_samples"] == 40 and v["bytes"] > 0
        assert v["provenance"]["recipe"]["layers"] == {"aux": [0, 1], "target": [3]}
    again = run_cli("build", str(tiny_store.parent / "m.toml"), "--limit", "40", "--quiet", "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert [r["samples_written"] for r in summary["variants"]] == [0, 0]
    assert [r["samples_present"] for r in summary["variants"]] == [40, 40]
    # another codec changes no number: the same variant, which keeps its codec, and the build says so
    r = run_cli("build", str(tiny_store.parent / "m.toml"), "--limit", "40", "--quiet", "--codec", "zstd")
    assert "nothing new" in r.stdout and " beside " not in r.stderr  # no fork note
    for v in info["variants"]:
        assert (
            f"variant {v['id']} keeps its codec {v['codec']} (codec zstd was asked for): a codec changes no "
            "stored number, so it is not a new variant"
        ) in r.stderr, r.stderr
    assert sorted(
        json.loads(run_cli("info", str(tiny_store), "--json").stdout)["variants"][i]["id"] for i in range(2)
    ) == sorted(v["id"] for v in info["variants"])


def test_same_environment_build_is_bit_identical(tiny_store: Path, tmp_path: Path):
    m = write_manifest(tmp_path / "m.toml", dtypes='["bf16"]', layers="{ aux = [0, 1], target = [3] }")
    assert run_cli("build", str(m), "--limit", "40", "--quiet").returncode == 0
    assert_bit_exact(f"{tmp_path / 'store.zarr'}", f"{tiny_store}#dtype=bf16", 40)


def test_an_inline_worker_runs_only_the_backend_this_process_binds():
    """Inline workers share this process, which binds the torch kernels (conftest): a torch plan runs, an fla
    plan must not record torch kernels as fla's and is refused naming why."""
    from hsstore.capture.model.kernels import bind_backend
    from hsstore.core.errors import BadInput

    bind_backend("torch")
    with pytest.raises(BadInput, match="backend 'fla' cannot run in this process: it already binds torch kernels"):
        bind_backend("fla")
    with pytest.raises(BadInput, match="unknown backend 'cuda'"):
        bind_backend("cuda")


@pytest.mark.process
def test_torch_backend_is_forced_even_when_kernel_packages_import(tmp_path: Path):
    env = {"PYTHONPATH": STANDIN}
    probe = json.loads(run_cli("env", "--model", "builtin:tiny-qwen3_5", "--json", env=env).stdout)
    assert probe["kernels_bound"]["chunk_gated_delta_rule"] == "fla"  # what transformers would pick by itself
    m = write_manifest(tmp_path / "m.toml")
    r = run_cli("build", str(m), "--limit", "3", "--quiet", "--backend", "torch", env=env)
    assert r.returncode == 0, r.stderr
    # transformers' notice that the (here importable) kernel packages are "not installed": hsstore blocked them
    assert "falling back to its reference PyTorch implementation" not in r.stderr, r.stderr
    assert not [line for line in r.stderr.splitlines() if line.startswith("[transformers]")], r.stderr
    (v,) = Store.open(tmp_path / "store.zarr").variants
    assert v.provenance["environment"]["kernels"]["chunk_gated_delta_rule"] == "torch"
    assert v.provenance["environment"]["kernels"]["causal_conv1d"] == "torch"
    # and --backend fla really binds the (stand-in) fla kernels, which are called and refuse: that build is
    # tests/capture/test_lineage.py::test_a_failed_build_records_how_it_ended (one process build for both proofs)


@pytest.mark.process
def test_fla_that_does_not_run_on_the_build_device_is_reported_and_refused(tmp_path: Path):
    """transformers >= 5.25 calls fla only for inputs on the devices it lists for fla (cuda, xpu, ...), and its
    torch code for any other: fla importable on a CPU host is not fla bound. `hsstore env` says what really runs,
    and `build --backend fla` is refused naming the device, before a sample is written (it once recorded
    nothing useful: "transformers bound 'torch'", with no reason). The stand-in fla here lists no CPU."""
    from transformers.integrations import hub_kernels

    gated = hasattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES")  # older releases call fla on every device
    env = {"PYTHONPATH": STANDIN, "HSSTORE_STANDIN_RUNS_ON_CPU": "0"}
    probe = json.loads(run_cli("env", "--model", "builtin:tiny-qwen3_5", "--json", env=env).stdout)
    assert probe["kernels_bound"]["chunk_gated_delta_rule"] == ("torch" if gated else "fla")
    assert probe["kernels_bound"]["causal_conv1d"] == ("torch" if gated else "causal_conv1d")
    m = write_manifest(tmp_path / "m.toml")
    r = run_cli("build", str(m), "--limit", "3", "--quiet", "--backend", "fla", env=env)
    assert r.returncode == (2 if gated else 1), r.stderr
    if gated:
        assert "does not run on cpu" in r.stderr and "--backend torch" in r.stderr, r.stderr
    else:
        assert "stand-in fla kernel called" in r.stderr, r.stderr
    assert not (tmp_path / "store.zarr").exists() or Store.open(tmp_path / "store.zarr").variants == []


def test_reordered_input_file_reuses_committed_states(tmp_path: Path):
    rows = (REPO / "hsstore" / "data" / "conversations.jsonl").read_text().splitlines()[:12]
    (tmp_path / "a.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(list(reversed(rows))[::2]) + "\n")
    ma = write_manifest(
        tmp_path / "a.toml",
        files=[str(tmp_path / "a.jsonl")],
        model="builtin:tiny-llama",
        layers="{ aux = [1], target = [2] }",
    )
    mb = write_manifest(
        tmp_path / "b.toml",
        files=[str(tmp_path / "b.jsonl")],
        model="builtin:tiny-llama",
        layers="{ aux = [1], target = [2] }",
    )
    assert run_cli("build", str(ma), "--quiet").returncode == 0
    r = run_cli("build", str(mb), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    (res,) = json.loads(r.stdout)["variants"]
    assert res["samples_written"] == 0 and res["samples_present"] == 6
    (v,) = Store.open(tmp_path / "store.zarr").variants
    assert v.n_samples == 12 and v.provenance["environment"]["kernels"]["chunk_gated_delta_rule"] == "n/a"


def test_final_norm_is_a_named_capture_stored_beside_the_layers(tmp_path: Path):
    m = write_manifest(tmp_path / "m.toml", dtypes='["fp32"]', layers='{ aux = [0, 2], target = [3, "final_norm"] }')
    r = run_cli("build", str(m), "--limit", "6", "--quiet")
    assert r.returncode == 0, r.stderr
    (v,) = Store.open(tmp_path / "store.zarr").variants
    rec = v.provenance["recipe"]
    assert rec["final_norm"] is True and rec["layers"] == {"aux": [0, 2], "target": [3, 4]}  # id 4 = num_layers
    assert "(final norm)" in run_cli("info", str(tmp_path / "store.zarr")).stdout
    model = ModelSpec("builtin:tiny-qwen3_5").load(torch.float32, "cpu", None)
    ds = HiddenStateDataset(tmp_path / "store.zarr")
    assert len(ds) == 6
    for i in range(len(ds)):
        item = ds[i]
        with torch.no_grad():
            post = model.model.norm(item["target_hidden"][:, 0])  # the norm of the stored last decoder layer
        assert torch.allclose(item["target_hidden"][:, 1], post, atol=1e-6, rtol=0)
        assert not torch.allclose(item["target_hidden"][:, 1], item["target_hidden"][:, 0])

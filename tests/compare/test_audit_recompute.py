"""How an audit recomputes, as a user states it: ``--dtype`` (the precision the states were computed in,
stored at the cache's dtype), ``--backend`` and ``--attn`` that cannot run here (one line, exit 2, before
any model runs), and overrides on hsstore's own variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import REPO, run_cli
from interop_damage import damage, sample_file, sidecar

from hsstore.interop.exporter import ExportRequest, export_cache

MODEL = "builtin:tiny-qwen3_5"


def _audit(*args: str) -> tuple[int, dict]:
    r = run_cli("check", MODEL, *args, "--json", "-")
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)


CAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module", params=sorted(CAST))
def fp32_computed(
    request: pytest.FixtureRequest, tiny_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    """A SpecForge-layout cache whose states were computed in fp32 and saved at another dtype (a pipeline
    that casts when it writes; fp32: saved as computed): the fp32 variant exported, each file cast, its
    export record removed (a foreign cache), imported with the flags a user passes. (dtype, store)"""
    dtype = request.param
    root = tmp_path_factory.mktemp(f"fp32-as-{dtype}")
    folder = root / "specforge"
    export_cache(ExportRequest(f"{tiny_store}#dtype=fp32", "specforge", str(folder), limit=3))
    sidecar("specforge", folder).unlink()
    for i in range(3):
        damage(
            "specforge", sample_file("specforge", folder, i, ""), lambda a, t: (a.to(CAST[dtype]), t.to(CAST[dtype]))
        )
    store = str(root / "s.zarr")
    r = run_cli(
        "import",
        "specforge",
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
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return dtype, store


def test_dtype_says_what_the_states_were_computed_in(fp32_computed: tuple[str, str]):
    """--dtype fp32 on a bf16/fp16 cache recomputes in fp32 and stores the result as the cache does: a cache
    computed in fp32 and cast is then bit-exact against an fp64 floor; recomputed at its own dtype (the
    default) it is within that dtype's noise. An fp32 cache recomputes in fp32 by default."""
    dtype, store = fp32_computed
    code, rep = _audit(store, "--samples", "3", "--dtype", "fp32")
    assert code == 0 and rep["verdict_kind"] in ("identical", "within_noise"), rep["verdict"]
    if dtype != "fp32":  # alone vs in batches: fp32 roundoff may differ; a cast of fp32 states hides it
        assert rep["verdict_kind"] == "identical", rep["verdict"]
        assert rep["assumed"]["dtype"].startswith(f"fp32 (--dtype; the variant records {dtype})")
    assert rep["recompute"]["dtype"] == "fp32" and rep["recompute"]["floor_dtype"] == "fp64"
    code, rep = _audit(store, "--samples", "3")
    assert code == 0 and rep["recompute"]["dtype"] == dtype and "dtype" not in rep["assumed"], rep["verdict"]
    assert rep["recompute"]["floor_dtype"] == ("fp64" if dtype == "fp32" else "fp32")


def test_overrides_on_a_native_variant(tiny_store: Path):
    """hsstore's own variant audited with the recorded settings stated again (nothing assumed) and with
    another dtype: the fp32 variant recomputed in fp32 is bit-exact against its fp64 floor."""
    code, rep = _audit(f"{tiny_store}#dtype=fp32", "--samples", "2", "--backend", "torch", "--dtype", "fp32")
    assert code == 0 and rep["verdict_kind"] == "identical" and rep["assumed"] == {}, rep["verdict"]
    assert rep["recompute"]["floor_dtype"] == "fp64" and rep["recompute"]["batching"] == "recorded"
    code, rep = _audit(f"{tiny_store}#dtype=bf16", "--samples", "2", "--dtype", "fp32")
    assert rep["recompute"]["dtype"] == "fp32" and set(rep["sample_verdicts"][0]["layers"]) == {"0", "1", "3"}
    assert code == (0 if rep["defective_samples"] == 0 else 1)


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--backend", "fla", "backend 'fla' needs the flash-linear-attention kernels, which are not installed here"),
        (
            "--attn",
            "flash_attention_2",
            "attention 'flash_attention_2' needs the flash_attn package, which is not installed here",
        ),
    ],
)
def test_a_recomputation_that_cannot_run_here_is_one_line_exit_2(tiny_store: Path, option: str, value: str, words: str):
    from hsstore.capture.model.kernels import installed

    if installed({"--backend": "fla", "--attn": "flash_attn"}[option]):
        pytest.skip(f"{value} can run here")
    r = run_cli("check", MODEL, f"{tiny_store}#dtype=bf16", "--samples", "2", option, value)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [e for e in r.stderr.splitlines() if e.strip() and not e.startswith("[transformers]")]
    assert lines == [lines[0]] and lines[0].startswith(f"error: {words}"), r.stderr[-2000:]


@pytest.mark.process
def test_backend_torch_is_bound_before_the_model_loads(tiny_store: Path):
    """A host where fla is installed (the stand-in fla package on PYTHONPATH): `--backend torch` binds
    transformers' reference kernels before a model's config imports the modeling modules (it was refused:
    "this process binds the 'fla' gated-delta kernels"), and `--backend fla` really calls fla's. A real
    process: kernels are bound once per process."""
    env = {"PYTHONPATH": str(REPO / "tests" / "standin")}
    target = f"{tiny_store}#dtype=bf16"
    r = run_cli("check", MODEL, target, "--samples", "1", "--backend", "torch", "--json", "-", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["recompute"]["backend"] == "torch"
    r = run_cli("check", MODEL, target, "--samples", "1", "--backend", "fla", env=env)
    assert r.returncode == 1 and "stand-in" in r.stderr and "kernel called" in r.stderr, r.stderr[-2000:]


def test_a_cache_of_another_tokenizer_is_said(tiny_store: Path, tmp_path: Path):
    """A cache imported with one tokenizer, audited against a model folder whose tokenizer differs (its chat
    template): the states are judged for the stored token ids (they agree), and the report says the
    tokenizers differ — a dataset tokenized by the model's tokenizer has other sample keys."""
    import shutil

    from helpers import save_local_model

    model = save_local_model(tmp_path / "model", arch="tiny-qwen3_5")
    other = tmp_path / "other-template"
    shutil.copytree(model, other)
    for f in other.glob("chat_template*"):
        f.write_text(f.read_text().replace("<|im_start|>", "<|im_start|> "))
    folder = tmp_path / "specforge"
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "specforge", str(folder), limit=2))
    sidecar("specforge", folder).unlink()
    store = str(tmp_path / "s.zarr")
    r = run_cli(
        "import",
        "specforge",
        str(folder),
        "--store",
        store,
        "--tokenizer",
        str(model),
        "--model",
        str(model),
        "--layers",
        "0,1,3",
        "--capture",
        "output",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("check", str(model), store, "--samples", "1", "--json", "-")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["same_tokenizer"] is True
    assert not [n for n in rep["notes"] if "tokenizer" in n]
    r = run_cli("check", str(other), store, "--samples", "1", "--json", "-")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["same_tokenizer"] is False, rep["verdict"]
    assert rep["tokenizer_fingerprint"] != rep["recorded_tokenizer_fingerprint"]
    (note,) = [n for n in rep["notes"] if "tokenizer" in n]
    assert rep["recorded_tokenizer_fingerprint"][:16] in note and "other sample keys" in note, note


@pytest.mark.parametrize("layers, held", [("0,1,3", {}), ("1,2,3", {1: 0, 2: 1})])
def test_a_stored_floor_judges_an_imported_cache(tiny_store: Path, tmp_path: Path, layers: str, held: dict):
    """--floor STORE#SEL (hsstore's fp32 variant of the same samples) instead of the live floor: it holds only
    the stored layers, so other capture points are matched by margin; a right statement agrees, a wrong one
    is named slot by slot."""
    folder = tmp_path / "specforge"
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "specforge", str(folder), limit=2))
    sidecar("specforge", folder).unlink()
    store = str(tmp_path / "s.zarr")
    r = run_cli(
        "import",
        "specforge",
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
        "output",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code, rep = _audit(store, "--samples", "2", "--floor", f"{tiny_store}#dtype=fp32")
    assert rep["floor"].startswith(str(tiny_store)) and rep["recompute"]["floor_dtype"] is None
    assert code == (1 if held else 0), rep["verdict"]
    assert {(f["layer"], f["kind"], f.get("match")) for f in rep["findings"]} == {
        (L, "capture_point", j) for L, j in held.items()
    }


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"hidden_size": 128},
            r"has hidden_size 128, variant \w+ stores states of width 64: this model cannot produce",
        ),
        ({"num_hidden_layers": 6}, r"has 6 decoder layers, variant \w+ was made by a model with 4"),
        ({"num_hidden_layers": 3}, r"has 3 decoder layers, variant \w+ was made by a model with 4"),
        ({"vocab_size": 100}, r"variant \w+ holds token id \d+, .* has a vocabulary of 100: another tokenizer's cache"),
    ],
)
def test_a_model_that_cannot_produce_the_shapes_is_refused_before_it_runs(
    tiny_store: Path, tmp_path: Path, change: dict, words: str
):
    """Width, depth, vocabulary: one line, exit 2, read from the config alone — the folder has no weights,
    so nothing could have run."""
    import re

    from helpers import save_local_model

    model = save_local_model(tmp_path / "model", arch="tiny-qwen3_5")
    for f in model.glob("*.safetensors"):
        f.unlink()
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(change)
    if "num_hidden_layers" in change:
        cfg["layer_types"] = (cfg["layer_types"] * 3)[: change["num_hidden_layers"]]
    (model / "config.json").write_text(json.dumps(cfg))
    folder = tmp_path / "eagle"
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "eagle", str(folder), limit=2))
    store = str(tmp_path / "s.zarr")
    r = run_cli("import", "eagle", str(folder), "--store", store, "--tokenizer", MODEL, "--model", MODEL, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("check", str(model), store, "--samples", "2")
    lines = [e for e in r.stderr.splitlines() if e.strip() and not e.startswith("[transformers]")]
    assert r.returncode == 2 and len(lines) == 1 and re.search(words, lines[0]), r.stderr[-2000:]


def test_states_of_a_fine_tuned_checkpoint_are_other_weights(tiny_store: Path, tmp_path: Path):
    """A cache made by the base model, audited against a checkpoint fine-tuned from it (every weight moved
    by ~2 %): every checked sample diverges in every layer — other weights, and the fingerprint says so."""
    from helpers import save_local_model
    from safetensors.torch import load_file, save_file

    tuned = save_local_model(tmp_path / "tuned", arch="tiny-qwen3_5")
    g = torch.Generator().manual_seed(0)
    for f in tuned.glob("*.safetensors"):
        w = load_file(str(f))
        save_file(
            {
                k: (v.float() * (1 + 0.02 * torch.randn(v.shape, generator=g))).to(v.dtype).contiguous()
                for k, v in w.items()
            },
            str(f),
            metadata={"format": "pt"},
        )
    folder = tmp_path / "modelopt"
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "modelopt", str(folder), limit=3))
    sidecar("modelopt", folder).unlink()
    store = str(tmp_path / "s.zarr")
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
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("check", str(tuned), store, "--samples", "3", "--json", "-")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and rep["defects"] == {"other_weights": 3} and rep["same_model"] is False, rep["verdict"]
    assert all(set(v["layers"].values()) == {"other_weights"} for v in rep["sample_verdicts"])

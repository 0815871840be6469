"""Small real objects for tests and benchmarks: token samples, random states, a valid provenance, a variant,
committed (and crashed writers' uncommitted) units of it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from hsstore.core.keys import SampleTokens, sample_key
from hsstore.core.precision_names import SCALE_SCHEME
from hsstore.core.schema.store_records import CommitRecord
from hsstore.storage import layout
from hsstore.storage.store import Store
from hsstore.storage.writer import UnitWriter

# --- Model shapes the benchmarks build: name -> (config overrides of the builtin hybrid, aux layers, target layers).

SHAPES: dict[str, tuple[dict[str, Any], list[int], list[int]]] = {
    "tiny": ({}, [0, 1, 2], [3]),
    # Qwen3.5/3.6-27B-shaped decoder (64 layers, hidden 5120; the builtin byte tokenizer keeps the
    # embedding small, so the model has ~24.5 B decoder parameters rather than 26.9 B in total)
    "27b": (
        {
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 64,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
        },
        [1, 16, 31, 46],
        [61],
    ),
    # the 1.6 B hybrid of the seed experiment (hidden 2048, 24 layers): small enough to draw on a CPU
    "1.6b": (
        {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
        },
        [1, 8, 15],
        [22],
    ),
}


def config_toml(shape: str) -> str:
    """The manifest's ``config = { ... }`` line of ``shape`` ("" for a shape that overrides nothing)."""
    overrides = SHAPES[shape][0]
    if not overrides:
        return ""
    return "config = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in overrides.items()) + " }"


def layers_toml(shape: str) -> str:
    """The manifest's ``layers`` table of ``shape``: ``{ aux = [...], target = [...] }``."""
    _, aux, target = SHAPES[shape]
    return f"{{ aux = {aux}, target = {target} }}"


LAYERS = {"aux": [0, 1], "target": [2]}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_, AUX, TARGET = SHAPES["27b"]  # the benchmarks' layer choice: the 27B-shaped model's
BENCH_LAYERS = AUX + TARGET


def make_samples(lengths: list[int], seed: int = 0, tok: str = "tok") -> list[SampleTokens]:
    """One sample per length: random token ids in [0, 250) and a loss mask of about 70% ones."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(0, 250, n).astype(np.int32)
        mask = (rng.random(n) > 0.3).astype(np.uint8)
        out.append(SampleTokens(sample_key(tok, ids, mask), ids, mask))
    return out


def make_states(
    samples: list[SampleTokens], hidden: int, dtype: str, layers: list[int], seed: int = 0
) -> dict[int, torch.Tensor]:
    """layer -> [total tokens, hidden] standard-normal states in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n = sum(s.length for s in samples)
    return {i: torch.randn(n, hidden, generator=g).to(TORCH_DTYPES[dtype]) for i in layers}


def provenance(
    dtype: str = "bf16",
    backend: str = "torch",
    tok: str = "tok",
    layers: dict[str, list[int]] | None = None,
    model: str = "test",
    precision: str | None = None,
) -> dict[str, Any]:
    """The smallest provenance that fits the ``Provenance`` schema (what a 1.0 store records);
    ``precision`` (e.g. "fp8-e4m3"): the states are stored quantized (``environment.storage``)."""
    prov: dict[str, Any] = {
        "recipe": {
            "model": {"name": model, "path": "/x"},
            "tokenizer": {"fingerprint": tok},
            "layers": layers or LAYERS,
        },
        "environment": {
            "dtype": dtype,
            "backend": backend,
            "device": "cpu",
            "host": "h",
            "kernels": {"chunk_gated_delta_rule": backend, "causal_conv1d": backend, "attention": "sdpa"},
        },
    }
    if precision:
        prov["environment"]["storage"] = {"precision": precision, "scale": SCALE_SCHEME}
    return prov


def new_variant(
    store: Store,
    dtype: str = "bf16",
    hidden: int = 16,
    codec: str = "zstd",
    chunk: int = 64,
    backend: str = "torch",
    layers: dict[str, list[int]] | None = None,
) -> str:
    """A variant of ``provenance(dtype, backend)`` in ``store``; returns its id."""
    layers = layers or LAYERS
    return store.create_variant(provenance(dtype, backend, layers=layers), layers, hidden, dtype, codec, chunk)


def _unit(
    store: Store, vid: str, lengths: list[int], seed: int, writer_id: str | None
) -> tuple[list[SampleTokens], dict[int, torch.Tensor], CommitRecord | None]:
    rec = store.variant_record(vid)
    samples = make_samples(lengths, seed=seed)
    states = make_states(samples, rec.hidden_size, rec.dtype, rec.all_layers)
    return samples, states, UnitWriter(store, vid, writer_id=writer_id).write(samples, states)


def write_unit(
    store: Store, vid: str, lengths: list[int], seed: int = 0, writer_id: str | None = None
) -> tuple[list[SampleTokens], dict[int, torch.Tensor]]:
    """One committed unit of variant ``vid`` (stored as computed): samples of ``lengths`` (token seed
    ``seed``) with random states of the variant's width, dtype and layers (samples committed already
    are skipped, as by any writer). Returns (samples, states)."""
    samples, states, _ = _unit(store, vid, lengths, seed, writer_id)
    return samples, states


def crashed_unit(store: Store, vid: str, lengths: list[int], seed: int = 0, writer_id: str = "crashed") -> str:
    """A unit of ``vid`` whose writer died before committing it: its files are there, its commit record
    is not. Returns its id."""
    commit = _unit(store, vid, lengths, seed, writer_id)[2]
    if commit is None:
        raise ValueError(f"samples of lengths {lengths} (seed {seed}) are committed in variant {vid} already")
    store.io.remove(layout.commit_key(vid, commit.unit))
    return commit.unit


def store_with_unit(
    path: Any, lengths: list[int], seed: int = 0, writer_id: str = "w", **variant: Any
) -> tuple[Store, str, list[SampleTokens], dict[int, torch.Tensor]]:
    """A new store at ``path`` (a path or a back end) with one variant (``new_variant(store, **variant)``)
    holding one committed unit by ``writer_id`` (``write_unit``). Returns (store, variant id, samples, states)."""
    store = Store.create(path)
    vid = new_variant(store, **variant)
    samples, states = write_unit(store, vid, lengths, seed, writer_id)
    return store, vid, samples, states


def one_sample_units(path: Any, lengths: list[int], seed: int = 0, **variant: Any) -> tuple[Store, str]:
    """A new store at ``path`` with one variant (``new_variant(store, **variant)``) holding one committed
    unit per sample of ``lengths`` (the i-th with states of seed i), by one writer: many small commits,
    e.g. for a convert to be stopped between. Returns (store, variant id)."""
    store = Store.create(path)
    vid = new_variant(store, **variant)
    rec = store.variant_record(vid)
    writer = UnitWriter(store, vid)
    for i, sample in enumerate(make_samples(lengths, seed=seed)):
        writer.write([sample], make_states([sample], rec.hidden_size, rec.dtype, rec.all_layers, seed=i))
    return store, vid


def make_data(n: int, hidden: int, seed: int = 0) -> tuple[list[SampleTokens], list[torch.Tensor]]:
    """Samples and their states [T, 5, H] in bf16, shaped like real hidden states (heavy-tailed)."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    samples, states = [], []
    scale = torch.exp(torch.randn(hidden, generator=g))  # per-channel scales, like a residual stream
    for _ in range(n):
        t = int(rng.integers(400, 1200))
        ids = rng.integers(0, 150000, t).astype(np.int32)
        mask = np.ones(t, np.uint8)
        samples.append(SampleTokens(sample_key("bench", ids, mask), ids, mask))
        states.append((torch.randn(t, len(BENCH_LAYERS), hidden, generator=g) * scale).to(torch.bfloat16))
    return samples, states

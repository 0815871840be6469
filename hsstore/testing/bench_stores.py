"""The formats the read benchmarks compare, written from the same samples: one torch.save file per sample
(and its map-style reader) and an hsstore store with a given codec (units of 8 samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hsstore.core.keys import SampleTokens, sample_key
from hsstore.storage.codecs import chunk_tokens
from hsstore.storage.store import Store
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import AUX, BENCH_LAYERS, TARGET, new_variant, provenance


def write_torch(d: Path, samples: list[SampleTokens], states: list[torch.Tensor]) -> None:
    """One ``i.pt`` per sample: input_ids, aux_hidden [T, 4, H], target_hidden [T, 1, H]."""
    for i, (s, st) in enumerate(zip(samples, states)):
        torch.save({"input_ids": torch.from_numpy(s.input_ids), "aux_hidden": st[:, :4].clone(),
                    "target_hidden": st[:, 4:].clone()}, d / f"{i}.pt")


def write_hsstore(d: Path, samples: list[SampleTokens], states: list[torch.Tensor], codec: str,
                  unit_samples: int = 8, chunk: int | None = None) -> None:
    """``d/s.zarr``: one bf16 variant with ``codec``, the samples in units of ``unit_samples``, chunks of
    ``chunk`` rows (default: what a build picks, ``chunk_tokens``)."""
    store = Store.create(d / "s.zarr")
    H = states[0].shape[-1]
    layers = {"aux": AUX, "target": TARGET}
    vid = store.create_variant(provenance("bf16", tok="bench", layers=layers, model=f"bench-{codec}"),
                               layers, H, "bf16", codec, chunk or chunk_tokens(H, 2))
    w = UnitWriter(store, vid, check_health=False)
    for a in range(0, len(samples), unit_samples):
        chunk = states[a: a + unit_samples]
        w.write(samples[a: a + unit_samples], {layer: torch.cat([s[:, j] for s in chunk]) for j, layer in enumerate(BENCH_LAYERS)})


class TorchDS(Dataset):
    """Map-style reader of ``write_torch``'s files (``torch.load``, weights only)."""

    def __init__(self, d: Path, n: int) -> None:
        self.d, self.n = d, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.load(self.d / f"{i}.pt", weights_only=True)


def write_tiny_store(path: Path, n_samples: int, unit_samples: int = 1000, length: int = 4, hidden: int = 8,
                     seed: int = 0) -> tuple[Store, str]:
    """A store at ``path`` with one bf16 variant (``factories.LAYERS``, width ``hidden``) of ``n_samples``
    distinct samples of ``length`` tokens, ``unit_samples`` to a unit, written straight through the
    UnitWriter (no model): the many-small-samples shape of a large DFlash run, built in seconds.
    Returns (store, variant id)."""
    store = Store.create(path)
    vid = new_variant(store, hidden=hidden, codec="none", chunk=4096)
    w = UnitWriter(store, vid, writer_id="tiny", check_health=False)
    base = np.random.default_rng(seed).integers(0, 250, length).astype(np.int32)
    mask = np.ones(length, np.uint8)
    rec = store.variant_record(vid)
    g = torch.Generator().manual_seed(seed)
    for a in range(0, n_samples, unit_samples):
        samples = []
        for i in range(a, min(n_samples, a + unit_samples)):
            ids = base.copy()
            ids[0] = i  # distinct token ids: distinct keys
            samples.append(SampleTokens(sample_key("tok", ids, mask), ids, mask))
        n = len(samples) * length
        w.write(samples, {layer: torch.randn(n, hidden, generator=g).to(torch.bfloat16) for layer in rec.all_layers},
                skip_committed=False)
    return store, vid

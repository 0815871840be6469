"""storage.sizing against the writer: with the codec left out every byte is predictable, so a unit's
predicted size must match the files a real UnitWriter commits (metadata sizes aside), in every form."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsstore import Store
from hsstore.core.quant import quantize
from hsstore.storage.codecs import chunk_tokens
from hsstore.storage.sizing import METADATA_BYTES, Ratios, StoredForm, files_per_unit, unit_bytes
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import LAYERS, make_samples, make_states, provenance

HIDDEN = 96


@pytest.mark.parametrize("form", ["bf16", "fp16", "fp32", "fp8-e4m3"])
@pytest.mark.parametrize("lengths", [[7], [300, 1200, 41]])
def test_an_uncompressed_unit_is_the_size_sizing_predicts(tmp_path: Path, form: str, lengths: list[int]):
    dtype, precision = ("bf16", form) if form == "fp8-e4m3" else (form, None)
    stored = StoredForm.of(dtype, precision, "none")
    store = Store.create(tmp_path / "s.zarr")
    layers = sorted({i for ids in LAYERS.values() for i in ids})
    vid = store.create_variant(
        provenance(dtype, layers=LAYERS, precision=precision),
        LAYERS,
        HIDDEN,
        dtype,
        "none",
        chunk_tokens(HIDDEN, stored.itemsize),
        precision=precision,
    )
    samples = make_samples(lengths)
    states = make_states(samples, HIDDEN, dtype, layers)
    if precision:
        states = {i: quantize(t) for i, t in states.items()}
    commit = UnitWriter(store, vid).write(samples, states)
    predicted = unit_bytes(sum(lengths), HIDDEN, layers, stored, Ratios(1.0))
    arrays = 2 + len(layers) * (2 if stored.quantized else 1)
    metadata_slack = arrays * METADATA_BYTES // 4 + 300  # zarr.json sizes are estimated, not computed
    assert abs(sum(predicted.values()) - sum(commit.files.values())) <= metadata_slack, (predicted, commit.files)
    per_layer_meta = (2 if stored.quantized else 1) * METADATA_BYTES
    for i in layers:  # each layer's shard (and its scales' shard) to the byte
        shards = sum(
            n
            for rel, n in commit.files.items()
            if rel.split("/")[0] in (f"layer_{i}", f"scale_{i}") and not rel.endswith("zarr.json")
        )
        assert predicted[f"layer_{i}"] - per_layer_meta == shards, (i, predicted, commit.files)
    assert len(commit.files) + 1 == files_per_unit(len(layers), stored.quantized)  # + its commit record

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_samples, make_states, new_variant

from hsstore import HiddenStateDataset, ProvenanceMismatch, Store
from hsstore.capture.model.spec import ModelSpec
from hsstore.compare.check import check_live_model
from hsstore.core.errors import BadInput
from hsstore.read.dataset import pad_collate
from hsstore.storage.writer import UnitWriter


def test_items_by_role_in_stored_dtype(tiny_store: Path):
    ds = HiddenStateDataset(tiny_store, variant="dtype=bf16")
    assert ds.layer_roles == {"aux": [0, 1], "target": [3]} and ds.hidden_size == 64
    item = ds[0]
    T = item["input_ids"].shape[0]
    assert item["aux_hidden"].shape == (T, 2, 64) and item["target_hidden"].shape == (T, 1, 64)
    assert item["aux_hidden"].dtype == torch.bfloat16
    raw = ds.reader.read(item["key"])
    assert torch.equal(item["target_hidden"][:, 0], raw["layers"][3])
    sub = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[1, 3])
    assert sub.layer_roles == {"aux": [1], "target": [3]}
    assert torch.equal(sub[0]["aux_hidden"][:, 0], item["aux_hidden"][:, 1])


def test_require_names_dtype_and_passes_for_itself(tiny_store: Path):
    bf16 = HiddenStateDataset(tiny_store, variant="dtype=bf16")
    with pytest.raises(ProvenanceMismatch) as e:
        HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16)
    assert "environment.dtype: 'fp32' (store) != 'bf16' (required)" in str(e.value)
    HiddenStateDataset(tiny_store, variant="dtype=bf16", require=bf16)
    HiddenStateDataset(tiny_store, variant="dtype=bf16", require=f"{tiny_store}#dtype=bf16")
    HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16, allow_drift=["dtype"])


def test_allow_drift_takes_none_and_one_name_not_its_letters(tiny_store: Path):
    bf16 = HiddenStateDataset(tiny_store, variant="dtype=bf16")
    HiddenStateDataset(tiny_store, variant="dtype=bf16", require=bf16, allow_drift=None)  # None: nothing drifts
    with pytest.raises(ProvenanceMismatch):
        HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16, allow_drift=None)
    HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16, allow_drift="dtype")  # one name
    with pytest.raises(ProvenanceMismatch):  # ("d", "t", "y", ...) would allow nothing, silently
        HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16, allow_drift="kernels")
    with pytest.raises(BadInput, match="allow_drift takes provenance field names"):
        HiddenStateDataset(tiny_store, variant="dtype=fp32", require=bf16, allow_drift=[1])


def test_require_names_the_kernel_field(tmp_path: Path):
    store = Store.create(tmp_path / "s.zarr")
    for backend in ("torch", "fla"):
        vid = new_variant(store, backend=backend)
        samples = make_samples([5])
        UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))
    torch_ds = HiddenStateDataset(tmp_path / "s.zarr", variant="backend=torch")
    with pytest.raises(
        ProvenanceMismatch, match=r"environment.kernels.chunk_gated_delta_rule: 'fla' \(store\) != 'torch' \(required\)"
    ):
        HiddenStateDataset(tmp_path / "s.zarr", variant="backend=fla", require=torch_ds)


def test_live_model_check(tiny_store: Path):
    spec = ModelSpec("builtin:tiny-qwen3_5")
    model = spec.load(torch.bfloat16, "cpu", "sdpa")
    check_live_model(model, f"{tiny_store}#dtype=bf16")
    with pytest.raises(ProvenanceMismatch, match="environment.dtype: 'bf16' \\(live model\\) != 'fp32'"):
        check_live_model(model, f"{tiny_store}#dtype=fp32")
    model.config._attn_implementation = "eager"
    with pytest.raises(ProvenanceMismatch, match="kernels.attention: 'eager'"):
        check_live_model(model, f"{tiny_store}#dtype=bf16")


def test_pad_collate_masks():
    items = [
        {
            "key": str(i),
            "index": i,
            "input_ids": torch.arange(n),
            "loss_mask": torch.ones(n, dtype=torch.bool),
            "aux_hidden": torch.ones(n, 2, 4),
            "target_hidden": torch.ones(n, 1, 4),
        }
        for i, n in enumerate((3, 5))
    ]
    b = pad_collate(items)
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert b["aux_hidden"][0, 3:].abs().sum() == 0


def test_pad_collate_refuses_items_of_another_form_or_dtype_in_one_batch(tiny_store: Path):
    """A batch takes its states' dtype and fields from its first item: a raw FP8 item after a dequantized one was
    copied in as its codes' values (254.0 for a state of 0.078) with its scales dropped, and an fp32 item after a
    bf16 one rounded to bf16, both silently (a ConcatDataset over variants). Either order is refused now."""
    bf16 = HiddenStateDataset(tiny_store, variant="dtype=bf16")[0]
    fp32 = HiddenStateDataset(tiny_store, variant="dtype=fp32")[1]
    raw = {
        **fp32,
        **{f"{r}_hidden": fp32[f"{r}_hidden"].to(torch.float8_e4m3fn) for r in ("aux", "target")},
        **{f"{r}_scales": torch.ones(fp32[f"{r}_hidden"].shape[:2]) for r in ("aux", "target")},
    }
    for items, first, other in (
        ([bf16, fp32], "bfloat16", "float32"),
        ([fp32, bf16], "float32", "bfloat16"),
        ([bf16, raw], "absent", "float32"),
    ):
        with pytest.raises(BadInput, match="item 1's .*differ from item 0's") as e:
            pad_collate(items)
        assert other in str(e.value).split("differ")[0] and first in str(e.value).split("differ")[1], e.value
    with pytest.raises(BadInput, match="item 1 has no 'aux_scales'"):  # (this order was refused before too)
        pad_collate([raw, bf16])
    fewer = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[0, 3])[0]  # one aux layer, not three
    with pytest.raises(BadInput, match=r"item 1's 'aux_hidden' \(bfloat16 \[1, 64\]\) differ"):
        pad_collate([bf16, fewer])  # (before: a RuntimeError from a tensor copy)
    assert (
        pad_collate([bf16, HiddenStateDataset(tiny_store, variant="dtype=bf16")[2]])["aux_hidden"].dtype
        == torch.bfloat16
    )


def test_pad_collate_takes_items_without_key_and_names_a_missing_field():
    """Items built outside a dataset (no ``key``/``index``) batch; an item without a field the batch needs
    is a one-line error naming the field and the item. Before, both were a bare KeyError from inside hsstore."""
    from hsstore.core.errors import BadInput

    items = [
        {
            "input_ids": torch.arange(n),
            "loss_mask": torch.ones(n, dtype=torch.bool),
            "target_hidden": torch.ones(n, 1, 4),
        }
        for n in (2, 4)
    ]
    b = pad_collate(items)
    assert "key" not in b and "index" not in b and b["target_hidden"].shape == (2, 4, 1, 4)
    del items[1]["target_hidden"]
    with pytest.raises(BadInput, match="item 1 has no 'target_hidden'"):
        pad_collate(items)
    with pytest.raises(BadInput, match="item 0 has no 'loss_mask'"):
        pad_collate([{"input_ids": torch.arange(3)}])


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_items_read_layers_straight_into_their_slots(tmp_path: Path, codec: str):
    """Whole chunks land in the strided [T, n_aux, H] buffer directly; partial ones through a copy."""
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store, codec=codec, chunk=64, hidden=16)
    samples = make_samples([1000, 37, 130])
    states = make_states(samples, 16, "bf16", [0, 1, 2])
    UnitWriter(store, vid).write(samples, states)
    ds = HiddenStateDataset(tmp_path / "s.zarr")
    assert sorted(ds.keys) == sorted(s.key for s in samples)
    off = {s.key: o for s, o in zip(samples, np.cumsum([0] + [s.length for s in samples]))}
    for i in range(len(ds)):
        it = ds[i]
        a, n = off[it["key"]], it["input_ids"].shape[0]
        assert torch.equal(it["aux_hidden"], torch.stack([states[0][a : a + n], states[1][a : a + n]], dim=1))
        assert torch.equal(it["target_hidden"][:, 0], states[2][a : a + n])
        assert it["aux_hidden"].is_contiguous()


def test_a_pickled_dataset_reads_the_snapshot_its_parent_opened(tmp_path: Path):
    """A dataset pickled for spawn workers while a writer keeps committing (here units whose ids sort
    before the first ones, so indices would shift): the copy has the parent's length and the parent's
    sample at every index."""
    import pickle

    from hsstore.read.dataset import HiddenStateDataset
    from hsstore.read.streaming import StreamingHiddenStateDataset
    from hsstore.testing.factories import store_with_unit, write_unit

    path = tmp_path / "s.zarr"
    store, vid, _, _ = store_with_unit(path, [5, 6, 7], seed=1, writer_id="w")
    ds, stream = HiddenStateDataset(str(path)), StreamingHiddenStateDataset(str(path), seed=3)
    keys = [ds[i]["key"] for i in range(len(ds))]
    write_unit(store, vid, [4, 9], seed=2, writer_id="a")  # the store grows after the datasets opened
    copy, stream_copy = pickle.loads(pickle.dumps(ds)), pickle.loads(pickle.dumps(stream))
    assert len(copy) == len(ds) == 3 and [copy[i]["key"] for i in range(len(copy))] == keys
    assert len(stream_copy) == len(stream) and [it["key"] for it in stream_copy] == [it["key"] for it in stream]
    assert len(HiddenStateDataset(str(path))) == 5  # a dataset opened now sees the new units


def test_a_non_integer_index_is_a_clear_type_error(tmp_path: Path):
    """ds[1.5] and ds["3"] are TypeErrors naming the index (not a bare KeyError from inside the reader);
    numpy integers and 0-d tensors still index."""
    from hsstore.testing.factories import store_with_unit

    store_with_unit(tmp_path / "s.zarr", [3, 4, 5])
    ds = HiddenStateDataset(tmp_path / "s.zarr")
    for bad in (1.5, "1", None):
        with pytest.raises(TypeError, match=f"dataset indices must be integers, not {type(bad).__name__}"):
            ds[bad]
    assert ds[np.int64(1)]["key"] == ds[torch.tensor(1)]["key"] == ds[1]["key"] == ds[-2]["key"]
    with pytest.raises(IndexError, match="out of range for 3 samples"):
        ds[3]


def test_a_store_path_and_variant_that_name_two_variants_are_refused(tiny_store: Path):
    """A config's ``STORE#dtype=fp32`` and a code default ``variant="dtype=bf16"``: which did the user mean?"""
    with pytest.raises(BadInput, match="names variant .* but variant='dtype=bf16' names"):
        HiddenStateDataset(f"{tiny_store}#dtype=fp32", variant="dtype=bf16")
    fp32 = HiddenStateDataset(f"{tiny_store}#dtype=fp32", variant="dtype=fp32")  # the same one: fine
    assert fp32.provenance["environment"]["dtype"] == "fp32"
    for empty in ("", " "):  # a config's empty variant is none given: the path's selector holds (it was dropped)
        assert HiddenStateDataset(f"{tiny_store}#dtype=fp32", variant=empty).variant_id == fp32.variant_id


def test_no_layers_is_refused_not_items_without_states(tiny_store: Path):
    with pytest.raises(BadInput, match=r"layers=\[\] reads no state"):
        HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[])


def test_a_layer_named_twice_is_refused_not_read_once(tiny_store: Path):
    """``layers=[0, 0, 3]`` gave one aux layer where the caller counted two slots, without a word."""
    from hsstore import StreamingHiddenStateDataset

    for cls in (HiddenStateDataset, StreamingHiddenStateDataset):
        with pytest.raises(BadInput, match=r"layers=\[0, 0, 3\] names a layer twice"):
            cls(tiny_store, variant="dtype=bf16", layers=[0, 0, 3])


def test_require_a_dataset_refuses_another_choice_of_layers_unless_allowed(tiny_store: Path):
    """An eval dataset required to match the training one read other conditioning layers in the same slots (train
    aux [0], eval aux [1], both [T, 1, H]) without a word: only the variant's provenance was compared."""
    from hsstore import StreamingHiddenStateDataset

    train = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[0, 3])
    with pytest.raises(BadInput, match=r"reads layers \{'aux': \[0\], 'target': \[3\]\}; this one reads"):
        HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[1, 3], require=train)
    with pytest.raises(BadInput, match="pass layers= the same ones"):
        StreamingHiddenStateDataset(tiny_store, variant="dtype=bf16", require=train)  # all layers: another choice
    same = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[3, 0], require=train)
    assert same.layer_roles == train.layer_roles
    other = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[1, 3], require=train, allow_drift=["layers"])
    assert other.layer_roles["aux"] == [1]

"""Training adapters (speculators / SpecForge items and batches) and EAGLE-3 draft vocabularies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from interop_files import TOKENIZER, WRITERS, random_samples

from hsstore import Store
from hsstore.core.errors import BadInput
from hsstore.interop.adapters import SpecForgeCollate, SpecForgeDataset, SpeculatorsCollate, SpeculatorsDataset
from hsstore.interop.imported_provenance import tokenizer_identity
from hsstore.interop.importer import ImportRequest, import_cache
from hsstore.interop.vocab import vocab_mapping, write_vocab_map


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    d = tmp_path_factory.mktemp("adapters")
    samples = random_samples(n=4, hidden=16, n_aux=3)
    WRITERS["specforge"](d / "src", samples)
    import_cache(
        ImportRequest(
            "specforge",
            str(d / "src"),
            str(d / "s.zarr"),
            tokenizer=TOKENIZER,
            num_layers=4,
            layers="0,1,2,final_norm",
            capture="output",
        )
    )
    return d / "s.zarr", samples


def _by_ids(samples: list, ids: torch.Tensor):
    return next(s for s in samples if torch.equal(s.ids, ids.reshape(-1)))


def test_speculators_items_match_its_arrow_dataset_items(imported):
    store, samples = imported
    ds = SpeculatorsDataset(str(store), max_len=9)
    assert len(ds) == 4 and ds.hidden_states_dtype == torch.bfloat16 and max(ds.approx_lengths) == 9
    it = ds[0]
    assert list(it) == [
        "hidden_states",
        "input_ids",
        "verifier_last_hidden_states",
        "loss_mask",
        "lengths",
        "position_ids",
    ]
    T = it["input_ids"].shape[0]
    assert it["hidden_states"].shape == (T, 3 * 16) and it["verifier_last_hidden_states"].shape == (T, 16)
    assert it["input_ids"].dtype == it["loss_mask"].dtype == it["position_ids"].dtype == torch.int64
    assert torch.equal(it["position_ids"], torch.arange(T)) and it["lengths"].tolist() == [T]
    s = next(s for s in samples if torch.equal(s.ids[:T], it["input_ids"]))
    # aux layers concatenated in slot order, like speculators' `hidden_states[:, :-1].flatten(1)`
    assert torch.equal(it["hidden_states"], s.aux[:T].reshape(T, -1))
    assert torch.equal(it["verifier_last_hidden_states"], s.target[:T])


def test_speculators_collate_packs_and_cuts_like_collatefn(imported):
    store, _ = imported
    ds = SpeculatorsDataset(str(store))
    items = [ds[i] for i in range(3)]
    lengths = [it["input_ids"].shape[0] for it in items]
    max_len = sum(lengths[:2]) + 2  # the third sample is cut after 2 tokens
    b = SpeculatorsCollate(max_len)(items)
    assert b["hidden_states"].shape == (1, max_len, 48) and b["input_ids"].shape == (1, max_len)
    assert b["document_ids"].tolist()[0] == [0] * lengths[0] + [1] * lengths[1] + [2, 2]
    assert torch.equal(b["input_ids"][0, : lengths[0]], items[0]["input_ids"]) and b["error_records"] == 0
    pad = SpeculatorsCollate(sum(lengths) + 5)(items)
    assert pad["document_ids"][0, -5:].tolist() == [-1] * 5 and pad["loss_mask"][0, -5:].sum() == 0


def test_specforge_items_and_padding_collate(imported):
    store, samples = imported
    ds = SpecForgeDataset(str(store), max_len=2048)
    it = ds[1]
    assert list(it) == ["attention_mask", "loss_mask", "target", "hidden_state", "input_ids"]
    T = it["input_ids"].shape[1]
    s = _by_ids(samples, it["input_ids"])
    assert it["hidden_state"].shape == (1, T, 48) and it["target"].shape == (1, T, 16)
    assert torch.equal(it["loss_mask"][0, :-1], s.mask[:-1]) and it["loss_mask"][0, -1] == 0  # never the last
    b = SpecForgeCollate()([ds[i] for i in range(4)])
    n = max(ds[i]["input_ids"].shape[1] for i in range(4))
    assert b["hidden_state"].shape == (4, n, 48) and b["target"].shape == (4, n, 16) and b["input_ids"].shape == (4, n)
    assert int(b["attention_mask"].sum()) == sum(ds[i]["input_ids"].shape[1] for i in range(4))


def test_adapter_refuses_variant_without_aux(tmp_path: Path):
    WRITERS["eagle"](tmp_path / "src", random_samples(n=2, n_aux=0))
    import_cache(
        ImportRequest(
            "eagle",
            str(tmp_path / "src"),
            str(tmp_path / "s.zarr"),
            tokenizer=TOKENIZER,
            num_layers=4,
            layers="final_norm",
            capture="output",
        )
    )
    with pytest.raises(BadInput, match="EAGLE-3 trainers need aux layers and exactly one target layer"):
        SpeculatorsDataset(str(tmp_path / "s.zarr"))


def test_vocab_mapping_ranks_by_count_then_id_and_pads_with_lowest_unused():
    counts = np.array([0, 5, 3, 5, 0, 1, 0, 0], dtype=np.int64)
    d2t, t2d = vocab_mapping(counts, 3)
    assert t2d.tolist() == [False, True, True, True, False, False, False, False]  # 1, 3 (5 each), then 2
    assert (torch.arange(3) + d2t).tolist() == [1, 2, 3] and d2t.dtype == torch.int64
    d2t, t2d = vocab_mapping(counts, 6)  # 4 seen tokens: pad with the lowest unused ids 0, 4
    assert torch.nonzero(t2d).flatten().tolist() == [0, 1, 2, 3, 4, 5]


def test_vocab_map_files_load_as_the_peers_load_them(imported, tmp_path: Path):
    store, samples = imported
    rec = write_vocab_map(str(store), 10, str(tmp_path / "vm"))
    masked = torch.cat([s.ids[s.mask.bool()] for s in samples])
    assert rec.loss_tokens == masked.numel() and rec.target_vocab_size == 259
    (vid,) = Store.open(store).variant_ids()
    assert rec.variant == vid
    assert rec.tokenizer_fingerprint == tokenizer_identity(TOKENIZER)[0]["fingerprint"]
    cache = torch.load(tmp_path / "vm" / "vocab_mapping-10.pt", weights_only=True)  # SpecForge / EAGLE-3
    d2t, t2d = (
        torch.from_numpy(np.load(tmp_path / "vm" / "d2t-10.npy")),
        torch.from_numpy(np.load(tmp_path / "vm" / "t2d-10.npy")),
    )
    assert torch.equal(cache["d2t"], d2t) and torch.equal(cache["t2d"], t2d) and t2d.shape == (259,)
    freq = torch.load(tmp_path / "vm" / "token_freq.pt", weights_only=True)  # speculators' token_freq.pt
    ids, counts = masked.unique(return_counts=True)
    assert freq == dict(zip(ids.tolist(), counts.tolist()))


def test_vocab_map_folder_is_its_own_or_refused(imported, tmp_path: Path):
    """A vocab-map replaces only files a vocab-map record of the folder names, of the same variant, and
    not while another vocab-map writes the folder; the record is written last, so it vouches for its files."""
    from hsstore.storage.leases import lock_folder_alone

    store, _ = imported
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "token_freq.pt").write_bytes(b"a user's file")
    with pytest.raises(BadInput, match=r"token_freq\.pt exists and no vocab-map record .* names it"):
        write_vocab_map(str(store), 10, str(theirs))
    assert (theirs / "token_freq.pt").read_bytes() == b"a user's file" and sorted(os.listdir(theirs)) == [
        "token_freq.pt"
    ]

    other = tmp_path / "other"
    write_vocab_map(str(store), 10, str(other))
    rec = json.loads((other / "vocab-map-10.json").read_text())
    rec["variant"] = "0" * 12  # as a vocab-map of another variant wrote it
    (other / "vocab-map-10.json").write_text(json.dumps(rec))
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    with pytest.raises(BadInput, match=f"holds a vocab-map of .*#{'0' * 12} .*choose another --out"):
        write_vocab_map(str(store), 12, str(other))
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before

    mine = tmp_path / "mine"
    first = write_vocab_map(str(store), 10, str(mine))
    busy = lock_folder_alone(str(mine))  # what a vocab-map writing the folder holds
    try:
        with pytest.raises(BadInput, match="is in use by another command right now"):
            write_vocab_map(str(store), 12, str(mine))
    finally:
        busy.release()
    again = write_vocab_map(str(store), 12, str(mine))  # same variant, another size: shares token_freq.pt
    assert again.files["token_freq.pt"] == first.files["token_freq.pt"]
    assert sorted(p.name for p in mine.iterdir()) == sorted(
        {*first.files, *again.files, "vocab-map-10.json", "vocab-map-12.json"}
    )


@pytest.mark.parametrize(
    "capture,stated,hsstore_id",
    [
        ("output", 0, 0),
        ("output", 3, 3),
        ("output", "final_norm", 4),
        ("input", 1, 0),
        ("input", 4, 3),
        ("input", "final_norm", 4),  # vLLM: 4 = last layer's output, pre-norm
        ("unknown", 4, 4),
        ("unknown", 2, 2),
    ],
)
def test_layer_conventions_map_both_ways(capture: str, stated, hsstore_id: int):
    from hsstore.core.layer_numbering import from_hsstore, to_hsstore

    assert to_hsstore(stated, capture, 4) == hsstore_id
    assert from_hsstore(hsstore_id, capture, 4) == (stated if capture != "unknown" else hsstore_id)


def test_per_sample_health_merges_into_the_units_stats():
    from hsstore.storage.stats import merge_health, stats_tensor

    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 8, generator=g).bfloat16() for n in (3, 5, 2)]
    parts[1][0, 0] = 0.0
    whole = stats_tensor(torch.cat(parts), [3, 5, 2])
    merged = merge_health([stats_tensor(p, [p.shape[0]]) for p in parts])
    assert merged.shape == whole.shape and torch.allclose(merged, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("adapter", [SpecForgeDataset, SpeculatorsDataset])
def test_an_adapter_is_a_provenance_to_require(imported, adapter):
    """Training on a peer's dataset form and evaluating on hsstore's (or the other way round) checks provenance
    the same way: ``require=`` takes the training adapter as it takes a dataset (it was a TypeError), and a
    dataset of other provenance is refused by it."""
    from hsstore import HiddenStateDataset, ProvenanceMismatch

    store, _ = imported
    train = adapter(str(store))
    assert HiddenStateDataset(store, require=train).provenance == train.provenance
    assert adapter(str(store), require=train).provenance == train.provenance
    other = dict(train.provenance, recipe=dict(train.provenance["recipe"], dtype="fp32"))
    with pytest.raises(ProvenanceMismatch):
        HiddenStateDataset(store, require=other)
    with pytest.raises(TypeError, match=r"a training adapter over one\), a reader or 'STORE#SELECTOR', not list$"):
        HiddenStateDataset(store, require=[train.provenance])


@pytest.mark.parametrize("adapter", [SpecForgeDataset, SpeculatorsDataset])
def test_an_adapter_over_a_dataset_checks_require_as_the_dataset_does(tiny_store: Path, adapter):
    """An adapter given a dataset dropped its require= and allow_drift= without a word: an eval reading other
    conditioning layers, or a variant of other provenance, opened. Now they are checked as the dataset checks them;
    a streaming dataset (which an adapter cannot index) is refused by name."""
    from hsstore import HiddenStateDataset, ProvenanceMismatch, StreamingHiddenStateDataset

    train = HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[0, 3])
    with pytest.raises(BadInput, match="pass layers= the same ones"):
        adapter(HiddenStateDataset(tiny_store, variant="dtype=bf16", layers=[1, 3]), require=train)
    with pytest.raises(ProvenanceMismatch):
        adapter(HiddenStateDataset(tiny_store, variant="dtype=fp32", layers=[0, 3]), require=train)
    kept = adapter(
        HiddenStateDataset(tiny_store, variant="dtype=fp32", layers=[0, 3]), require=train, allow_drift=["dtype"]
    )
    assert kept.base.layer_roles == train.layer_roles
    with pytest.raises(
        BadInput, match="takes a HiddenStateDataset .map-style. or a store, not a StreamingHiddenStateDataset"
    ):
        adapter(StreamingHiddenStateDataset(tiny_store, variant="dtype=bf16"))

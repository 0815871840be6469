from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, make_samples, make_states, new_variant, shared_dir

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


def test_a_world_size_without_a_rank_is_refused_not_every_rank_reading_rank_0s_share(tmp_path: Path):
    """``world_size=2`` alone, outside a process group, read rank 0's share on every rank (half the data never
    trained; under torchrun the group's rank is taken now: tests/dist_stream_check.py passes world_size alone);
    a rank alone, or one past the world, failed only at the first iteration with an error naming workers."""
    from hsstore import StreamingHiddenStateDataset

    store = Store.create(tmp_path / "s.zarr")
    UnitWriter(store, new_variant(store)).write(
        make_samples([4, 5, 6]), make_states(make_samples([4, 5, 6]), 16, "bf16", [0, 1, 2])
    )
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", world_size=2)
    with pytest.raises(BadInput, match=r"world_size=2\) without rank= and no torch.distributed process group"):
        list(ds)
    with pytest.raises(BadInput, match=r"rank=1 is not one of world_size=1's ranks"):
        StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1, world_size=1)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1)
    with pytest.raises(BadInput, match=r"rank=1\) without world_size="):
        list(ds)
    assert len(list(StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1, world_size=2))) in (1, 2)
    for bad in (
        {"world_size": 0, "rank": 0},
        {"world_size": 2, "rank": 0.5},
        {"world_size": 2, "rank": True},
        {"world_size": "2", "rank": 1},
    ):  # (world_size=0 read the whole store as world 1)
        with pytest.raises(BadInput, match="a whole number from"):
            StreamingHiddenStateDataset(tmp_path / "s.zarr", **bad)


def test_ranks_left_to_the_process_group_are_the_receiving_processes_and_a_world_past_it_is_refused(tmp_path: Path):
    """A dataset made before the process group and sent to the ranks (``mp.spawn(main, args=(ds,))``) froze
    world 1, rank 0 when pickled: every rank read the whole store. Unknown ranks now stay unknown in the pickle
    (a world_size alone, which could not be pickled, pickles); under a group they are the group's, and a
    world_size past the group's size (ranks whose shares no process reads) is refused."""
    import pickle

    from hsstore import StreamingHiddenStateDataset

    store = Store.create(tmp_path / "s.zarr")
    samples = make_samples([4, 5, 6, 7])
    UnitWriter(store, new_variant(store)).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))
    for kw in ({}, {"world_size": 2}):
        sent = pickle.loads(pickle.dumps(StreamingHiddenStateDataset(tmp_path / "s.zarr", **kw)))
        assert (sent._world, sent._rank) == (kw.get("world_size"), None)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ds = StreamingHiddenStateDataset(tmp_path / "s.zarr")
        assert (pickle.loads(pickle.dumps(ds))._world, pickle.loads(pickle.dumps(ds))._rank) == (1, 0)
        with pytest.raises(BadInput, match="world_size=2 but the process group has 1 ranks"):
            list(StreamingHiddenStateDataset(tmp_path / "s.zarr", world_size=2))
    finally:
        torch.distributed.destroy_process_group()


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


def _torchrun(nproc: int, store: Path, out: str, modes: str, context: str = "fork") -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(REPO / "tests" / "dist_stream_check.py"),
        str(store),
        out,
        modes,
        context,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _load(out: str, mode: str, n: int) -> list[dict]:
    return [json.loads(Path(f"{out}{mode}-{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="session")
def two_rank_streams(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One torchrun launch of two ranks (two DataLoader workers each) over the tiny store, shared by the
    tests below: full epochs, then a partial epoch with its state. What each rank saw is in
    ``{prefix}{mode}-{rank}.json``; the prefix is returned."""
    d = shared_dir(tmp_path_factory, "streams", lambda d: _torchrun(2, tiny_store, f"{d}/run-", "full,partial"))
    return f"{d}/run-"


@pytest.mark.process
def test_torchrun_two_ranks_two_workers_each_key_once_per_epoch(tiny_store: Path, two_rank_streams: str):
    ranks = _load(two_rank_streams, "full", 2)
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    assert len(all_keys) == 40
    for epoch in ("epoch0", "epoch1"):
        seen = [k for r in ranks for k in r[epoch]]
        assert len(seen) == len(all_keys) and set(seen) == all_keys
    assert [r["epoch0"] for r in ranks] == [r["epoch0_again"] for r in ranks]
    assert [r["epoch0"] for r in ranks] != [r["epoch1"] for r in ranks]


@pytest.mark.process
def test_torchrun_resume_mid_epoch_with_another_world_size(tiny_store: Path, two_rank_streams: str, tmp_path: Path):
    first = _load(two_rank_streams, "partial", 2)
    state = first[0]["state"]
    assert state == first[1]["state"]  # gathered over ranks
    out = str(tmp_path / "run-")
    Path(f"{out}state.json").write_text(json.dumps(state))
    _torchrun(1, tiny_store, out, "resume")
    before = [k for r in first for k in r["seen"]]
    after = _load(out, "resume", 1)[0]["seen"]
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    assert before and after
    assert not set(before) & set(after)
    assert len(before) + len(after) == len(all_keys) and set(before) | set(after) == all_keys


@pytest.mark.process
def test_torchrun_persistent_spawned_workers_keep_their_rank_and_resume_on_three_ranks(
    tiny_store: Path, tmp_path: Path
):
    """Spawned workers have no process group: each keeps its rank's share (not the whole store), follows
    set_epoch across epochs as persistent workers, and a state from 2 ranks resumes on 3: each key once."""
    out = str(tmp_path / "spawn-")
    _torchrun(2, tiny_store, out, "full,partial", "spawn")
    ranks = _load(out, "full", 2)
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    for epoch in ("epoch0", "epoch0_again", "epoch1"):
        seen = [k for r in ranks for k in r[epoch]]
        assert len(seen) == len(all_keys) and set(seen) == all_keys
    assert [r["epoch0"] for r in ranks] == [r["epoch0_again"] for r in ranks] != [r["epoch1"] for r in ranks]
    first = _load(out, "partial", 2)
    Path(f"{out}state.json").write_text(json.dumps(first[0]["state"]))
    _torchrun(3, tiny_store, out, "resume")
    before = [k for r in first for k in r["seen"]]
    after = [k for r in _load(out, "resume", 3) for k in r["seen"]]
    assert before and after and len(before) + len(after) == len(all_keys) and set(before) | set(after) == all_keys


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

    from hsstore.read.dataset import HiddenStateDataset, StreamingHiddenStateDataset
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


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"epoch": 0},
        [],
        {"epoch": "0", "seed": 0, "n": 3, "variant": "v", "consumed": ""},
        "bad-hex",
        "bytes-after-the-marks",
        "format-1",
    ],
)
def test_load_state_dict_refuses_what_state_dict_never_returns(state, tmp_path: Path):
    from hsstore import StreamingHiddenStateDataset
    from hsstore.core.errors import BadInput
    from hsstore.testing.factories import store_with_unit

    store_with_unit(tmp_path / "s.zarr", [3, 4, 5])
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr")
    good = ds.state_dict()
    if state == "bad-hex":
        state = {**good, "consumed": "zz"}
    elif state == "bytes-after-the-marks":  # a zlib stream that ends, then garbage: not what state_dict writes
        import base64

        state = {**good, "consumed": base64.b64encode(base64.b64decode(good["consumed"]) + b"junk").decode()}
    elif state == "format-1":
        state = {**good, "format": 1}
    with pytest.raises(BadInput, match="state"):
        ds.load_state_dict(state)
    ds.load_state_dict(good)  # what state_dict returns still loads


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


@contextlib.contextmanager
def _ranks(script: str, path: Path, d: Path) -> Iterator[list[subprocess.Popen]]:
    """Two ranks running ``script`` (gloo, a file rendezvous in ``d``); each must exit 0, and none outlives the test."""
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(path), str(d), str(r)], cwd=REPO, stderr=subprocess.PIPE)
        for r in (0, 1)
    ]
    try:
        yield procs
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stderr.read().decode()[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wait_for(flag: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)


_SKEWED_RANK = """
import json, os, sys, time
from pathlib import Path
import torch.distributed as dist
from hsstore import StreamingHiddenStateDataset
path, d, rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{d / 'rendezvous'}", rank=rank, world_size=2)
if rank == 0:
    (d / "r0-opens").write_text("")
else:  # this rank opens the store after it grew
    while not (d / "grown").exists():
        time.sleep(0.02)
ds = StreamingHiddenStateDataset(path, seed=3)
ds.set_epoch(0)
keys = []
for it in ds:
    keys.append(it["key"])
    ds.mark_consumed(it)
state = ds.state_dict()  # gathers every rank's marks
(d / f"r{rank}.json").write_text(json.dumps({"keys": keys, "n": ds.n, "consumed": int(ds.consumed.sum())}))
dist.destroy_process_group()
"""


@pytest.mark.process
def test_ranks_that_open_a_growing_store_moments_apart_read_rank_0s_snapshot(tmp_path: Path):
    """torchrun ranks start seconds apart while a build commits: each rank cut its share from its own snapshot (15
    samples on one, 30 on the other: samples trained twice or never, without a word), then the marks' gather failed
    on their sizes and aborted a rank. Every rank reads the units rank 0 opened: each of its samples once."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    first = make_samples([5, 6, 7, 8, 9, 10], seed=1)
    UnitWriter(store, vid).write(first, make_states(first, 16, "bf16", [0, 1, 2]))
    with _ranks(_SKEWED_RANK, path, tmp_path) as procs:
        _wait_for(tmp_path / "r0-opens", procs)
        time.sleep(1.0)  # rank 0 has opened the store (and waits for rank 1 to open it)
        later = make_samples([11, 12, 13, 14], seed=2)
        UnitWriter(store, vid).write(later, make_states(later, 16, "bf16", [0, 1, 2]))
        (tmp_path / "grown").write_text("")
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    # rank 0's snapshot (the first unit, unless a loaded machine let rank 0 open the store after it grew), once
    snap = first if got[0]["n"] == len(first) else first + later
    keys = got[0]["keys"] + got[1]["keys"]
    assert sorted(keys) == sorted(s.key for s in snap)
    assert [g["n"] for g in got] == [len(snap)] * 2 and sum(g["consumed"] for g in got) == len(snap)


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


_PRE_INIT_RANK = """
import json, sys, time
from pathlib import Path
import torch.distributed as dist
from hsstore import StreamingHiddenStateDataset
from hsstore.core.errors import BadInput
path, d, rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if rank == 1:  # this rank opens the store after it grew, both before the process group
    while not (d / "grown").exists():
        time.sleep(0.02)
ds = StreamingHiddenStateDataset(path, seed=3)
(d / f"r{rank}-opened").write_text("")
dist.init_process_group("gloo", init_method=f"file://{d / 'rendezvous'}", rank=rank, world_size=2)
if rank == 0:  # a dataset of this rank alone (rank= and world_size= given): not collective, no hang
    alone = len(list(StreamingHiddenStateDataset(path, rank=0, world_size=1)))
dist.barrier()
try:
    ds.state_dict()
    said = None
except BadInput as e:
    said = str(e)
(d / f"r{rank}.json").write_text(json.dumps({"said": said, "alone": alone if rank == 0 else None}))
dist.destroy_process_group()
"""


@pytest.mark.process
def test_ranks_whose_datasets_were_made_before_the_process_group_on_other_snapshots_are_told_at_the_gather(
    tmp_path: Path,
):
    """Datasets made before init_process_group cannot agree on a snapshot: the marks' gather aborted a rank in gloo
    (sizes differ); it is one BadInput on every rank naming the fix. A dataset given rank= and world_size= is one
    rank's own: made on rank 0 alone it neither waits for the others nor hangs."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    first = make_samples([5, 6, 7, 8], seed=1)
    UnitWriter(store, vid).write(first, make_states(first, 16, "bf16", [0, 1, 2]))
    with _ranks(_PRE_INIT_RANK, path, tmp_path) as procs:
        _wait_for(tmp_path / "r0-opened", procs)
        later = make_samples([9, 10], seed=2)
        UnitWriter(store, vid).write(later, make_states(later, 16, "bf16", [0, 1, 2]))
        (tmp_path / "grown").write_text("")
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    assert all("different snapshots of the store (4 to 6 samples)" in g["said"] for g in got), got
    assert got[0]["alone"] == len(first) + len(later)  # made after the store grew

"""Streaming training stays exact under DataLoader settings and resumes (issue 38): persistent spawned
workers follow the main process; a resume ties its marks to sample keys when the store was reordered or
grew, also on another number of ranks; Accelerate's prepared loader stopped and resumed trains the
uninterrupted order. Every check is by sample key on real stores."""

from __future__ import annotations

import contextlib
import json
import re
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hsstore import Store, StreamingHiddenStateDataset, pad_collate
from hsstore.core.errors import BadInput
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import make_samples, make_states, new_variant


def _commit(store: Store, vid: str, samples: list, writer: str, clock_behind: bool = False) -> None:
    """Commit ``samples`` as one unit by ``writer`` without skipping keys committed meanwhile: a writer that
    raced the others (it read the committed set before they committed); ``clock_behind``: on a host whose clock
    is behind the others', so its unit comes first in commit order and the indices of the store shift."""
    from unittest import mock

    from hsstore.storage import writer as writer_module

    rec = store.variant_record(vid)
    states = make_states(samples, rec.hidden_size, rec.dtype, rec.all_layers)
    with (
        mock.patch.object(writer_module, "_now", lambda: "2000-01-01T00:00:00.000+00:00")
        if clock_behind
        else contextlib.nullcontext()
    ):
        UnitWriter(store, vid, writer_id=writer).write(samples, states, skip_committed=False)


def _store(path: Path, units: int = 4, per: int = 10) -> tuple[Store, str, list[str]]:
    """A store of ``units`` units of ``per`` samples (lengths 5-24) by writers m0, m1, ...; returns its keys."""
    store = Store.create(path)
    vid = new_variant(store)
    keys = []
    for u in range(units):
        samples = make_samples([5 + (i * 7 + u) % 20 for i in range(per)], seed=u + 1)
        _commit(store, vid, samples, f"m{u}")
        keys += [s.key for s in samples]
    return store, vid, keys


def _train(ds: StreamingHiddenStateDataset, source: Any = None, stop: int | None = None) -> list[str]:
    """A training loop: the keys of each step (item or batch), each marked consumed; stops before step ``stop``."""
    keys: list[str] = []
    for step, it in enumerate(ds if source is None else source):
        if step == stop:
            break
        keys += it["key"] if isinstance(it["key"], list) else [it["key"]]
        ds.mark_consumed(it)  # an item or a batch: its indices, with the epoch (and its start) it was read in
    return keys


def _reload(state: dict) -> dict:
    return json.loads(json.dumps(state))  # what a checkpoint keeps


def _once(keys: list[str], expected: list[str]) -> None:
    dup = [k for k, c in Counter(keys).items() if c > 1]
    assert not dup, f"{len(dup)} sample(s) trained twice"
    assert set(keys) == set(expected), (
        f"{len(set(expected) - set(keys))} missed, {len(set(keys) - set(expected))} not expected"
    )


@pytest.mark.process
def test_persistent_spawned_workers_follow_set_epoch_mark_consumed_and_load_state_dict(tmp_path: Path):
    _store(tmp_path / "s.zarr")
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    ref = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="spawn")
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        ref.set_epoch(epoch)
        orders.append([it["key"] for it in loader])
        assert orders[-1] == [it["key"] for it in ref]  # the order without workers, epoch by epoch
    assert len({tuple(o) for o in orders}) == 3
    ds.set_epoch(3)
    ref.set_epoch(3)
    full = list(ref)
    ds.mark_consumed([it["index"] for it in full[:15]])  # marked in the main process after the workers started
    assert sorted(it["key"] for it in loader) == sorted(it["key"] for it in full[15:])
    ds.set_epoch(4)
    ref.set_epoch(4)
    full = list(ref)
    ds.mark_consumed([it["index"] for it in full[:9]])
    ds.set_epoch(4)  # the epoch in progress goes on (what a loop, or Accelerate, calls): in the same order
    assert [it["key"] for it in loader] == [it["key"] for it in full[9:]]
    other = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    other.set_epoch(5)
    done = _train(other, stop=7)
    ds.load_state_dict(_reload(other.state_dict()))
    rest = [it["key"] for it in loader]
    ref5 = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    ref5.set_epoch(5)
    assert done + rest == [it["key"] for it in ref5]


@pytest.mark.parametrize("stop", [1, 2, 3, 4, 5])
def test_resume_after_a_racing_commit_reordered_the_store_trains_each_key_once(tmp_path: Path, stop: int):
    """Two writers commit three samples each; a state is saved after ``stop`` steps; a racing writer whose clock is
    behind commits one sample of each (its unit comes first in commit order and wins those keys: indices shift)."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    a, b = make_samples([6, 7, 8], seed=1), make_samples([9, 10, 11], seed=2)
    _commit(store, vid, a, "m")
    _commit(store, vid, b, "n")
    ds = StreamingHiddenStateDataset(path, seed=4)
    ds.set_epoch(2)
    first = _train(ds, stop=stop)
    state = _reload(ds.state_dict())
    _commit(store, vid, [b[0], a[1]], "a", clock_behind=True)
    again = StreamingHiddenStateDataset(path, seed=4)
    assert [again.reader.ref(i).unit for i in range(2)] == ["a-000000"] * 2  # the store did reorder
    again.load_state_dict(state)
    _once(first + _train(again), [s.key for s in a + b])


@pytest.mark.parametrize("join", ["next_epoch", "this_epoch"])
def test_resume_after_the_store_grew(tmp_path: Path, join: str):
    """Samples committed after the state was saved join at the next epoch (default) or this one; the
    samples the state knew are trained once either way."""
    store, vid, keys = _store(tmp_path / "s.zarr", units=3, per=6)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=3)
    ds.set_epoch(1)
    first = _train(ds, stop=5)
    state = _reload(ds.state_dict())
    new = make_samples([4, 12, 9, 7], seed=99)
    _commit(store, vid, new, "a")  # sorts first: every old index shifts by four
    grown = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=3, new_samples=join)
    grown.load_state_dict(state)
    grown.set_epoch(1)  # the epoch in progress goes on
    _once(first + _train(grown), keys + ([s.key for s in new] if join == "this_epoch" else []))
    grown.set_epoch(2)
    _once(_train(grown), keys + [s.key for s in new])


@pytest.mark.parametrize("world,resume_world", [(2, 3), (3, 1), (2, 2)])
def test_resume_on_another_number_of_ranks_after_a_reorder(tmp_path: Path, world: int, resume_world: int):
    """Ranks (rank=, world_size=) each train a few batches; their gathered marks resume on another number of
    ranks after a racing commit reordered the store: every key of the epoch once over all ranks."""
    store, vid, keys = _store(tmp_path / "s.zarr")
    ranks = [
        StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, batch_tokens=48, rank=r, world_size=world)
        for r in range(world)
    ]
    first = []
    for r, ds in enumerate(ranks):
        ds.set_epoch(1)
        first += _train(ds, stop=2 + r)
    for ds in ranks[1:]:  # what state_dict gathers over a process group
        ranks[0].mark_consumed(np.flatnonzero(ds.consumed))
    state = _reload(ranks[0].state_dict())
    raced = make_samples([5 + (i * 7 + 1) % 20 for i in range(10)], seed=2)[3:8]  # five of unit m1's samples
    _commit(store, vid, raced, "a", clock_behind=True)
    rest = []
    for r in range(resume_world):
        ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, batch_tokens=48, rank=r, world_size=resume_world)
        ds.load_state_dict(state)
        rest += _train(ds)
    _once(first + rest, keys)


def test_an_old_format_state_loads_while_it_fits_and_is_refused_in_one_line_after(tmp_path: Path):
    store, vid, keys = _store(tmp_path / "s.zarr", units=2, per=6)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=8)
    ds.set_epoch(4)
    first = _train(ds, stop=5)
    old = {"epoch": 4, "seed": 8, "n": 12, "variant": vid, "consumed": np.packbits(ds.consumed).tobytes().hex()}
    same = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=8)
    same.load_state_dict(old)
    _once(first + _train(same), keys)
    _commit(store, vid, make_samples([5, 6], seed=50), "z")
    grown = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=8)
    with pytest.raises(BadInput, match=r"old format .* saved over 12 samples; the store serves 14 now") as e:
        grown.load_state_dict(old)
    assert "\n" not in str(e.value)


@pytest.mark.process
def test_accelerate_prepared_loader_stopped_and_resumed_trains_the_uninterrupted_order(tmp_path: Path):
    """Accelerate's prepare(DataLoader) with two workers and token-budget batches, two epochs: stopped
    mid-epoch, checkpointed, resumed in a new dataset and loader: the batches are the uninterrupted run's, in
    its order."""
    from accelerate import Accelerator, DataLoaderConfiguration

    _store(tmp_path / "s.zarr")

    def run(
        ds: StreamingHiddenStateDataset, stop: tuple[int, int] | None = None, start: int = 0
    ) -> tuple[list, dict | None]:
        # the dataset splits over ranks itself: Accelerate must not dispatch or re-shard its batches
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
        loader = acc.prepare(DataLoader(ds, batch_size=None, num_workers=2))
        seen = []
        for epoch in range(start, 2):
            loader.set_epoch(epoch)
            for step, batch in enumerate(loader):
                if (epoch, step) == stop:
                    return seen, _reload(ds.state_dict())
                seen.append(list(batch["key"]))
                ds.mark_consumed(batch["index"])
        return seen, None

    def fresh() -> StreamingHiddenStateDataset:
        return StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=5, batch_tokens=60)

    whole, _ = run(fresh())
    assert len(whole) > 8
    for stop in ((0, 3), (1, 1)):
        part, state = run(fresh(), stop)
        resumed = fresh()
        resumed.load_state_dict(state)
        rest, _ = run(resumed, start=state["epoch"])  # the loop starts at the checkpoint's epoch
        assert part + rest == whole


def test_a_state_stays_compact_for_five_million_samples():
    from hsstore.read.stream_state import pack_marks

    rng = np.random.default_rng(0)
    half = rng.random(5_000_000) < 0.5  # mid-epoch marks look random: the worst case
    assert len(pack_marks(half)) < 900_000
    assert len(pack_marks(np.zeros(5_000_000, bool))) < 2_000


def test_set_epoch_to_an_earlier_epoch_after_a_resume_is_refused(tmp_path: Path):
    """Accelerate calls set_epoch(its own count) when iterated: a loaded state would silently restart at
    epoch 0 unless told; that is one clear error."""
    _store(tmp_path / "s.zarr", units=1, per=5)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr")
    ds.set_epoch(3)
    _train(ds, stop=2)
    again = StreamingHiddenStateDataset(tmp_path / "s.zarr")
    again.load_state_dict(ds.state_dict())
    with pytest.raises(BadInput, match=r"set_epoch\(0\) after load_state_dict of a state in epoch 3"):
        again.set_epoch(0)
    again.set_epoch(3)
    assert len(list(again)) == 3


@pytest.mark.process  # DataLoader workers
@pytest.mark.parametrize("workers", [0, 2])
def test_iterating_a_fully_consumed_epoch_without_set_epoch_is_refused_not_empty(tmp_path: Path, workers: int):
    """A loop that marks what it trained but never calls set_epoch would train on nothing from epoch 1 on."""
    store, vid, _ = _store(tmp_path / "s.zarr", units=2, per=5)
    ds = StreamingHiddenStateDataset(store.location, variant=vid, seed=3)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    for item in loader:
        ds.mark_consumed(item["index"])
    with pytest.raises(Exception, match=r"epoch 0 is fully consumed .*call set_epoch\(1\)"):
        next(iter(loader))
    ds.set_epoch(1)
    assert len([item["index"] for item in loader]) == 10


def test_a_negative_epoch_or_seed_is_refused_in_one_line(tmp_path: Path):
    store, vid, _ = _store(tmp_path / "s.zarr", units=1, per=3)
    with pytest.raises(BadInput, match="seed=-1"):
        StreamingHiddenStateDataset(store.location, variant=vid, seed=-1)
    ds = StreamingHiddenStateDataset(store.location, variant=vid, seed=1)
    with pytest.raises(BadInput, match=r"set_epoch\(-2\)"):
        ds.set_epoch(-2)
    state = ds.state_dict()
    with pytest.raises(BadInput, match=r"state\['epoch'\] = -1 is not a count"):
        StreamingHiddenStateDataset(store.location, variant=vid, seed=1).load_state_dict({**state, "epoch": -1})


def _ranks(path: Path, world: int, **kw: Any) -> list[StreamingHiddenStateDataset]:
    return [StreamingHiddenStateDataset(path, seed=3, rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize(("world", "resume_world", "steps"), [(4, 8, 9), (3, 3, 13), (2, 3, 6)])
def test_set_epoch_after_a_resume_goes_on_on_every_rank_even_one_whose_share_is_done(
    tmp_path: Path, world: int, resume_world: int, steps: int
):
    """A resumed loop calls set_epoch(e) for the epoch in progress (Accelerate does). A rank whose share of what
    is left is empty (fewer samples left than ranks) or done used to start the epoch afresh, splitting the whole
    epoch while the others split the rest: samples trained twice. Every key exactly once, on every rank alike."""
    _, _, keys = _store(tmp_path / "s.zarr")
    ranks = _ranks(tmp_path / "s.zarr", world)
    first = []
    for ds in ranks:
        ds.set_epoch(0)
        first += _train(ds, stop=steps)
    for ds in ranks[1:]:  # what state_dict gathers over a process group
        ranks[0].mark_consumed(np.flatnonzero(ds.consumed))
    state = _reload(ranks[0].state_dict())
    rest = []
    for ds in _ranks(tmp_path / "s.zarr", resume_world):
        ds.load_state_dict(state)
        ds.set_epoch(0)
        rest += _train(ds)
    _once(first + rest, keys)


def test_set_epoch_of_a_resumed_epoch_that_is_done_is_empty_not_trained_again(tmp_path: Path):
    _store(tmp_path / "s.zarr", units=2, per=5)
    ranks = _ranks(tmp_path / "s.zarr", 2)
    for ds in ranks:
        _train(ds)
    ranks[0].mark_consumed(np.flatnonzero(ranks[1].consumed))
    state = _reload(ranks[0].state_dict())
    for ds in _ranks(tmp_path / "s.zarr", 2):
        ds.load_state_dict(state)
        with pytest.warns(UserWarning, match=r"epoch 0 has nothing left to train .*set_epoch\(1\) starts the next"):
            ds.set_epoch(0)  # the loop `for e in range(state["epoch"], E)`: the epoch is over, not run again
        assert _train(ds) == []
        with _no_warning():  # nothing of epoch 0 is left to skip
            ds.set_epoch(1)
        assert len(_train(ds)) == 5


@contextlib.contextmanager
def _no_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_skipping_the_rest_of_a_resumed_epoch_says_how_many_samples_it_skips(tmp_path: Path):
    _store(tmp_path / "s.zarr", units=2, per=5)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    _train(ds, stop=4)
    again = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=1)
    again.load_state_dict(_reload(ds.state_dict()))
    with pytest.warns(UserWarning, match=r"set_epoch\(1\) .* epoch 0: its 6 samples not yet consumed are skipped"):
        again.set_epoch(1)


@pytest.mark.parametrize("world", [3, 4, 7])
def test_drop_with_batch_tokens_gives_every_rank_as_many_batches(tmp_path: Path, world: int):
    """DDP needs every rank to take as many steps: one with a batch more waits in its gradients' all-reduce
    forever. remainder="drop" with batch_tokens cuts each rank to the fewest batches any rank has."""
    _store(tmp_path / "s.zarr")
    for epoch in (0, 1):
        per_rank, seen = [], []
        for ds in _ranks(tmp_path / "s.zarr", world, batch_tokens=64, remainder="drop"):
            ds.set_epoch(epoch)
            batches = list(ds)
            per_rank.append(len(batches))
            seen += [k for b in batches for k in b["key"]]
        assert len(set(per_rank)) == 1 and per_rank[0] > 0, per_rank
        assert len(seen) == len(set(seen))
    keep = [len(list(ds)) for ds in _ranks(tmp_path / "s.zarr", 4, batch_tokens=64)]
    assert len(set(keep)) > 1  # (what "keep" gives on this store: the drop above is not vacuous)


def test_drop_over_more_ranks_than_samples_is_refused_not_an_empty_epoch(tmp_path: Path):
    _store(tmp_path / "s.zarr", units=1, per=5)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=0, world_size=6, remainder="drop")
    with pytest.raises(BadInput, match="remainder='drop' over 6 ranks leaves every rank nothing of the 5 samples"):
        list(ds)
    assert len(list(StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=0, world_size=6))) == 1  # keep: one each


def test_keep_with_batch_tokens_warns_when_ranks_would_take_different_numbers_of_batches(tmp_path: Path):
    """The default remainder keeps every sample, so token batches may leave ranks with different step counts: a
    DDP job would hang in an all-reduce. set_epoch says so once, naming the counts and the way out."""
    _store(tmp_path / "s.zarr")
    ranks = _ranks(tmp_path / "s.zarr", 4, batch_tokens=64)
    counts = sorted({len(list(ds)) for ds in ranks})
    assert len(counts) > 1  # (this store's cut: the warning is due)
    with pytest.warns(UserWarning, match=rf"ranks take {counts[0]} to {counts[-1]} batches; .*remainder='drop'"):
        ranks[0].set_epoch(0)
    with _no_warning():
        ranks[0].set_epoch(1)  # once
        for ds in _ranks(tmp_path / "s.zarr", 4, batch_tokens=64, remainder="drop"):
            ds.set_epoch(0)  # drop: every rank as many batches
        StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=3, batch_tokens=64).set_epoch(0)  # one rank


@pytest.mark.parametrize("batch_tokens", [None, 64])
def test_marks_of_an_epoch_that_is_over_do_not_skip_samples_of_the_next(tmp_path: Path, batch_tokens: int | None):
    """A loop that marks late (its last steps' marks flushed after set_epoch(e + 1): gradient accumulation across
    the epoch's end, a step-behind checkpoint hook) marks samples epoch e trained: ``mark_consumed(batch)`` reads
    the epoch each item carries and leaves the new epoch's marks alone (one warning), so epoch e + 1 trains all."""
    _, _, keys = _store(tmp_path / "s.zarr")
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, batch_tokens=batch_tokens)
    ds.set_epoch(0)
    late = []
    for step, batch in enumerate(ds):
        assert (batch["epoch"] == 0).all() if batch_tokens else batch["epoch"] == 0
        if step % 3 == 2:
            late.append(batch)  # every third step's marks wait ...
        else:
            ds.mark_consumed(batch)
    ds.set_epoch(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in late:  # ... and are flushed once the next epoch started
            ds.mark_consumed(batch)
    assert len(caught) == 1 and re.search(
        r"left out: their items \(read in epoch 0\) .* started epoch 1 anew", str(caught[0].message)
    ), caught
    assert not ds.consumed.any()
    _once(_train(ds), keys)


def test_mark_consumed_takes_the_epoch_of_each_mark(tmp_path: Path):
    """``mark_consumed(indices, epoch=)``: an int for all, or one per index (a DataLoader batch's
    ``epoch`` tensor); only the marks of the epoch in progress count."""
    _store(tmp_path / "s.zarr", units=1)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2)
    ds.set_epoch(3)
    ds.mark_consumed([0, 1], epoch=3)
    with pytest.warns(UserWarning, match=r"1 mark\(s\) left out: their items \(read in epoch 2\)"):
        ds.mark_consumed(torch.tensor([2, 3]), epoch=torch.tensor([3, 2]))
    assert np.flatnonzero(ds.consumed).tolist() == [0, 1, 2]
    with pytest.raises(BadInput, match="epoch"):
        ds.mark_consumed([4, 5], epoch=[3, 3, 3])
    with pytest.raises(BadInput, match="index"):
        ds.mark_consumed({"epoch": torch.tensor([3])})
    with pytest.raises(BadInput, match=f"index {ds.n} is not one of this dataset's {ds.n} samples"):
        ds.mark_consumed([ds.n], epoch=3)
    with pytest.raises(BadInput, match=f"index {ds.n} is not"):  # checked also where the epoch is another
        ds.mark_consumed([ds.n], epoch=2)
    for bad in ([0.0, 1.7], torch.tensor([True, False]), ["3"], [{"index": 1}]):
        with pytest.raises(BadInput, match="whole numbers"):
            ds.mark_consumed(bad, epoch=3)
    with pytest.raises(BadInput, match="whole numbers"):
        ds.mark_consumed([4], epoch=3.0)
    ds.mark_consumed(np.array(4), epoch=np.array(3))  # 0-d arrays are one index, one epoch
    assert ds.consumed[4]


def test_marks_of_a_pass_a_rollback_discarded_do_not_count_in_the_restored_one(tmp_path: Path):
    """A rollback within an epoch (load_state_dict of a checkpoint of the same epoch, after a loss spike) with a
    step-behind marking hook: the pending batch was read after the checkpoint, and its step thrown away. Its items
    carry the epoch's start (``epoch_start``), which the load began anew: its marks are left out, so the
    restored pass trains every sample the checkpoint had not. Under warnings-as-errors the kept marks of a mixed
    flush count before the warning raises."""
    _, _, keys = _store(tmp_path / "s.zarr")
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=4)
    ds.set_epoch(0)
    it = iter(ds)
    done = _train(ds, it, stop=10)
    checkpoint = _reload(ds.state_dict())
    pending = next(it)  # read after the checkpoint; its step is discarded by the rollback
    ds.load_state_dict(checkpoint)
    with pytest.warns(UserWarning, match="left out"):
        ds.mark_consumed(pending)  # the hook's late flush
    assert not ds.consumed[pending["index"]]
    _once(done + _train(ds), keys)

    ds.set_epoch(1)
    first = next(iter(ds))
    ds.set_epoch(2)
    second = next(iter(ds))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning):
            ds.mark_consumed(
                {
                    "index": torch.tensor([first["index"], second["index"]]),
                    "epoch": torch.tensor([1, 2]),
                    "epoch_start": torch.tensor([first["epoch_start"], second["epoch_start"]]),
                }
            )
    assert np.flatnonzero(ds.consumed).tolist() == [second["index"]]


def test_items_of_workers_carry_the_epoch_their_iteration_began_in(tmp_path: Path):
    """DataLoader workers (fork) stamp each item with the epoch they read when the iteration began; the default
    pad_collate makes it a tensor that ``mark_consumed(batch)`` takes."""
    _, _, keys = _store(tmp_path / "s.zarr")
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=pad_collate)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        seen = []
        for batch in loader:
            assert batch["epoch"].tolist() == [epoch] * len(batch["index"])
            ds.mark_consumed(batch)
            seen += batch["key"]
        _once(seen, keys)
        assert ds.consumed.all()


@pytest.mark.parametrize("batch_tokens", [None, 64])
def test_len_is_what_this_rank_yields_now_as_a_loader_and_its_schedule_need(tmp_path: Path, batch_tokens: int | None):
    """``len(loader)`` (a learning-rate schedule's steps, Trainer's max_steps) came from ``len(ds)``: every sample
    of the store, whatever the rank, world size or batch_tokens (24 where a rank yielded 5 batches). It is what
    iterating yields now on this rank (its unconsumed samples, or their batches), through 2 DataLoader workers too."""
    _store(tmp_path / "s.zarr")
    for rank in (0, 1):
        ds = StreamingHiddenStateDataset(
            tmp_path / "s.zarr", seed=5, batch_tokens=batch_tokens, rank=rank, world_size=2
        )
        ds.set_epoch(0)
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        steps = list(loader)
        assert len(ds) == len(loader) == len(steps) < ds.n, (rank, len(ds), len(steps))
        ds.mark_consumed(steps[0])
        assert len(ds) == len(list(loader)) == len(steps) - 1


def test_a_state_saved_with_shuffle_resumes_only_with_shuffle(tmp_path: Path):
    """The state named its seed and variant, not whether the order was shuffled: a shuffled epoch's state loaded
    into ``shuffle=False`` ran the rest in key order, not the order it resumes (each sample still once)."""
    _store(tmp_path / "s.zarr")
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=6)
    ds.set_epoch(0)
    _train(ds, stop=5)
    state = _reload(ds.state_dict())
    with pytest.raises(BadInput, match="saved with shuffle=True; this dataset has shuffle=False"):
        StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=6, shuffle=False).load_state_dict(state)
    for bad in ("true", None, 1):
        with pytest.raises(BadInput, match=r"state\['shuffle'\] is .*not True or False"):
            StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=6).load_state_dict({**state, "shuffle": bad})
    with pytest.raises(BadInput, match="shuffle='no'; pass True or False"):  # ("no" shuffled: it is truthy)
        StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=6, shuffle="no")  # type: ignore[arg-type]
    del state["shuffle"]  # a state saved before it was recorded: loads as it did
    StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=6, shuffle=False).load_state_dict(state)


def test_a_state_saved_when_units_were_read_by_id_resumes_each_key_once(tmp_path: Path):
    """Readers used to take units by id; they take them in commit order now. A state saved then names its units in
    id order and marks samples by their place in it: it resumes by key, each key of the epoch once."""
    from hsstore.read.stream_state import pack_marks, snapshot_digest

    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    samples = make_samples([6, 7, 8, 9, 10, 11], seed=3)
    for writer, part in (("z", samples[:3]), ("b", samples[3:])):  # committed in the other order than by id
        _commit(store, vid, part, writer)
        time.sleep(0.01)  # (commit times are kept to the millisecond)
    ds = StreamingHiddenStateDataset(path, seed=4)
    assert [ds.reader.ref(i).unit for i in (0, 3)] == ["z-000000", "b-000000"]
    first = _train(ds, stop=4)
    state = _reload(ds.state_dict())
    by_id = sorted(state["units"])  # the state the older reader saved: units by id, marks by place in that order
    old_keys = [k for u, _ in by_id for k in (r.key for r in ds.reader.unit_refs(u))]
    marked = set(np.asarray(list(ds.reader.keys))[ds.consumed].tolist())
    state.update(
        units=by_id,
        digest=snapshot_digest([(u, c) for u, c in by_id]),
        consumed=pack_marks(np.array([k in marked for k in old_keys])),
    )
    again = StreamingHiddenStateDataset(path, seed=4)
    again.load_state_dict(state)
    _once(first + _train(again), [s.key for s in samples])


def test_a_rank_that_trained_its_whole_share_after_a_resume_is_not_told_samples_are_skipped(tmp_path: Path):
    """A state of one rank resumed on two: each rank trains its whole share of what is left, then set_epoch(1). Each
    rank counted the other's share as not consumed (its marks since are not known here) and warned that samples
    were skipped, though every sample was trained once."""
    _, _, keys = _store(tmp_path / "s.zarr", units=2, per=10)
    one = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, rank=0, world_size=1)
    one.set_epoch(0)
    first = _train(one, stop=6)
    state = _reload(one.state_dict())
    ranks = [StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, rank=r, world_size=2) for r in (0, 1)]
    rest = []
    for ds in ranks:
        ds.load_state_dict(state)
        ds.set_epoch(0)
        rest += _train(ds)
    _once(first + rest, keys)
    for ds in ranks:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds.set_epoch(1)
    with pytest.warns(UserWarning, match="its 3 samples not yet consumed are skipped"):  # a rank that stopped early
        late = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2, rank=1, world_size=2)
        late.load_state_dict(state)
        _train(late, stop=len(rest) // 2 - 3)
        late.set_epoch(1)


def test_a_state_saved_before_a_unit_was_quarantined_and_rebuilt_resumes_by_key(tmp_path: Path):
    """A unit damaged after a checkpoint: verify --quarantine takes back its commit, its samples are written again
    in a new unit, and the checkpoint resumes by key (it was refused: a unit it names is not committed now)."""
    from hsstore.storage.verify import verify

    store, vid, keys = _store(tmp_path / "s.zarr", units=2, per=10)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2)
    ds.set_epoch(0)
    first = _train(ds, stop=6)
    state = _reload(ds.state_dict())
    damaged = ds.reader.ref(len(keys) - 1).unit  # a unit with samples not trained yet
    (tmp_path / "s.zarr" / "variants" / vid / "units" / damaged / "layer_1" / "c" / "0" / "0").unlink()
    assert verify(store, quarantine=True).quarantined == [f"{vid}/{damaged}"]
    u = int(damaged[1:].split("-")[0])  # _store's writer m<u>
    _commit(store, vid, make_samples([5 + (i * 7 + u) % 20 for i in range(10)], seed=u + 1), "rebuilt")
    again = StreamingHiddenStateDataset(tmp_path / "s.zarr", seed=2)
    again.load_state_dict(state)
    _once(first + _train(again), keys)

"""The capture pipeline on the real tiny hybrid: what it writes, its timing split, the pinned pool."""

from __future__ import annotations

import pytest
import torch
from helpers import make_samples, new_variant

from hsstore import Store
from hsstore.capture.model.spec import ModelSpec
from hsstore.capture.run.hooks import LayerCapture
from hsstore.capture.run.pipeline import PinnedPool, capture_to_store, pinned_size
from hsstore.storage.writer import UnitWriter


@pytest.fixture(scope="module")
def hybrid():
    return ModelSpec("builtin:tiny-qwen3_5").load(torch.float32, "cpu", "sdpa")


def test_every_sample_is_written_and_the_steady_state_excludes_the_first_batch(hybrid, tmp_path):
    hidden = hybrid.config.hidden_size
    samples = make_samples([40, 33, 25, 18, 12, 9])
    batches = [[0, 1], [2, 3], [4], [5]]
    store = Store.create(tmp_path / "s.zarr")
    layers = {"aux": [0, 1], "target": [3]}
    vid = new_variant(store, dtype="fp32", hidden=hidden, layers=layers)
    writer = UnitWriter(store, vid, check_health=False)
    out = capture_to_store(hybrid, 4, [0, 1, 3], samples, batches, writer, "cpu", 0, unit_tokens=50)
    assert out.samples_written == len(samples)
    reader = Store.open(tmp_path / "s.zarr").reader(vid)
    assert set(reader.keys) == {s.key for s in samples}
    alone = LayerCapture(hybrid, 4, [3])  # the last sample, run by itself
    ids = torch.from_numpy(samples[5].input_ids.astype("int64"))[None]
    want = alone.run(ids, torch.ones_like(ids))[3][0]
    alone.close()
    assert torch.allclose(reader.read(samples[5].key, [3])["layers"][3], want, atol=1e-5)
    first = samples[0].length + samples[1].length
    assert out.steady_tokens == sum(s.length for s in samples) - first
    assert 0 < out.first_batch_seconds <= out.loop_seconds
    assert 0 < out.steady_seconds <= out.loop_seconds - out.first_batch_seconds


def test_shortfall_counts_only_what_the_free_buffers_do_not_cover():
    pool = PinnedPool()
    pool.give(torch.empty(100, dtype=torch.uint8))
    pool.give(torch.empty(30, dtype=torch.uint8))
    assert pool.shortfall([90, 90, 20]) == [90]  # 100 covers one 90, 30 covers 20
    assert pool.shortfall([10, 10, 10]) == [10]
    assert pool.shortfall([]) == []


def test_a_reservation_that_cannot_pin_reports_it_and_the_pool_stays_usable():
    pool = PinnedPool()
    got = pool.reserve_in_background([1 << 20, 1 << 20]).wait()
    if torch.cuda.is_available():  # (sizes already powers of two: what torch's pinned allocator hands out)
        assert got["pinned_reserve_error"] is None and got["pinned_reserve_bytes"] == 2 << 20
        assert pool.shortfall([1 << 20, 1 << 20]) == []
    else:  # no accelerator: page-locking fails; the loop would allocate on demand (and fail the same way)
        assert got["pinned_reserve_error"] and got["pinned_reserve_bytes"] == 0
        assert pool.free == []


def test_pinned_sizes_are_the_power_of_two_the_allocator_hands_out_anyway():
    assert [pinned_size(n) for n in (1, 2, 3, 1 << 20, (1 << 20) + 1, 382_515_200)] == [
        1,
        2,
        4,
        1 << 20,
        2 << 20,
        1 << 29,
    ]


def test_units_take_their_place_in_batch_order_whichever_writing_thread_commits_first(tmp_path):
    """Two threads write a capture's units, and either may commit first: a unit's place among the writer's units
    is taken when it is handed over, in batch order, so two builds of the same inputs order their samples alike
    (the first unit here commits last)."""
    import threading

    from hsstore.capture.run.pipeline import BackgroundWriter
    from hsstore.testing.factories import make_states

    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    writer = UnitWriter(store, vid, writer_id="w")
    second_done = threading.Event()
    write = writer.write

    def first_waits(samples, states, **kw):  # the first unit's thread is the slow one
        if kw["seq"] == 0:
            assert second_done.wait(60)
        out = write(samples, states, **kw)
        if kw["seq"] == 1:
            second_done.set()
        return out

    writer.write = first_waits  # type: ignore[method-assign]
    background = BackgroundWriter(writer, threads=2)
    units = [make_samples([5, 7], seed=1), make_samples([6, 4], seed=2)]
    for samples in units:
        background.put(samples, make_states(samples, 16, "bf16", [0, 1, 2]), [], [])
    background.close()
    assert list(Store.open(tmp_path / "s.zarr").reader(vid).keys) == [s.key for u in units for s in u]

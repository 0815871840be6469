"""Map-style reads in a steady order fetch the coming samples' bytes ahead: same items in every order,
errors on the item they belong to, no thread left behind, safe across a DataLoader's fork, off in workers."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TaggedItems, make_samples, make_states, new_variant
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset, Store
from hsstore.core.errors import CorruptData
from hsstore.read import prefetch_reads
from hsstore.storage import layout
from hsstore.storage.local import LocalRange
from hsstore.storage.writer import UnitWriter

LAYERS = [0, 1, 2]


@pytest.fixture(autouse=True)
def _small_samples_look_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_reads, "MIN_BYTES", 0)  # these samples are small: look ahead all the same
    # a store just written is in the page cache, whose chunks are left to the read: fetch them anyway
    monkeypatch.setattr(LocalRange, "cached", lambda self, offset, n: False)


def _store(tmp_path: Path, codec: str = "shuffle-zstd") -> tuple[Path, dict[str, torch.Tensor]]:
    """Three units of samples spanning several chunks of 16 rows (neighbours share their boundary chunks);
    returns the path and each key's states ``[T, 3, H]``."""
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store, codec=codec, chunk=16, hidden=32)
    want: dict[str, torch.Tensor] = {}
    for u, lengths in enumerate([[40, 23, 57, 9, 31], [70, 18], [25, 44, 38]]):
        samples = make_samples(lengths, seed=u)
        states = make_states(samples, 32, "bf16", LAYERS, seed=u)
        UnitWriter(store, vid).write(samples, states)
        a = 0
        for s in samples:
            want[s.key] = torch.stack([states[i][a : a + s.length] for i in LAYERS], dim=1)
            a += s.length
    return tmp_path / "s.zarr", want


def _same(item: dict, want: dict[str, torch.Tensor]) -> None:
    got = torch.cat([item["aux_hidden"], item["target_hidden"]], dim=1)
    assert torch.equal(got, want[item["key"]])


def _lookahead_threads(other_than: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hsstore-lookahead") and t not in other_than]


@pytest.mark.parametrize("codec,cached", [("shuffle-zstd", False), ("none", False), ("shuffle-zstd", True)])
def test_every_order_reads_the_same_items_and_in_order_reads_come_from_the_fetched_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, cached: bool
):
    if cached:  # chunks in the page cache: only the tokens come from the fetch
        monkeypatch.setattr(LocalRange, "cached", lambda self, offset, n: True)
    path, want = _store(tmp_path, codec)
    ds = HiddenStateDataset(path)
    n = len(ds)
    rng = np.random.default_rng(0)
    orders = {
        "in order": list(range(n)),
        "again": list(range(n)),
        "backwards": list(range(n))[::-1],
        "every second": list(range(0, n, 2)) + list(range(1, n, 2)),
        "random": [int(i) for i in rng.permutation(n)],
        "interleaved": [i for pair in zip(range(n // 2), range(n // 2, n)) for i in pair],
        "restarts": [0, 1, 2, 3, 0, 1, 2, 7, 8, 9, 5],
    }
    for name, order in orders.items():
        for i in order:
            _same(ds[i], want)
        if name in ("in order", "again", "backwards", "every second"):
            assert ds._lookahead().used >= len(order) - 3, name  # all but the first reads of the order
    assert (ds._lookahead().fetched_bytes > 0) != cached


@pytest.mark.parametrize("codec", ["shuffle-zstd", "none"])
def test_a_corrupt_chunk_fails_the_items_it_belongs_to_and_no_others(tmp_path: Path, codec: str):
    path, _ = _store(tmp_path, codec)
    ds = HiddenStateDataset(path)
    ref = ds.reader.ref(2)  # the 57-token sample of the first unit: its middle chunk is its own
    f = path / "variants" / ds.variant_id / "units" / ref.unit / layout.layer_array(1) / "c" / "0" / "0"
    shard = ds.reader.shard(ref.unit, layout.layer_array(1))
    off, nbytes = shard.spans[(ref.offset + 20) // shard.chunk_rows]
    data = bytearray(f.read_bytes())
    data[off + nbytes // 2] ^= 0x10
    f.write_bytes(bytes(data))

    def outcome(d: HiddenStateDataset, i: int) -> str:
        try:
            return d[i]["key"]
        except CorruptData as e:
            return f"CorruptData: {e}"

    alone = [outcome(HiddenStateDataset(path), i) for i in range(len(ds))]  # one read each: nothing ahead
    ahead = HiddenStateDataset(path)
    assert [outcome(ahead, i) for i in range(len(ds))] == alone
    assert alone[2].startswith("CorruptData") and ref.key in alone[2]
    assert ahead._lookahead().fetched_bytes > 0


def test_the_fetch_thread_ends_with_its_dataset_or_on_close(tmp_path: Path):
    # an earlier test's dataset in this worker may not be collected yet: count only this test's threads
    others = frozenset(_lookahead_threads())
    path, want = _store(tmp_path)
    ds = HiddenStateDataset(path)
    for i in range(4):
        _same(ds[i], want)
    assert len(_lookahead_threads(others)) == 1
    ds._lookahead().close()
    assert _lookahead_threads(others) == []
    for i in range(4):  # still reads, and looks ahead again
        _same(ds[i], want)
    assert len(_lookahead_threads(others)) == 1
    del ds
    gc.collect()
    deadline = time.monotonic() + 10
    while _lookahead_threads(others) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _lookahead_threads(others) == []


def test_dataloader_workers_forked_while_the_main_process_looks_ahead_read_every_item(tmp_path: Path):
    path, want = _store(tmp_path)
    ds = HiddenStateDataset(path)
    for i in range(3):  # the main process now fetches the following samples on its thread
        ds[i]
    tagged = TaggedItems(ds, "ahead_in_worker", lambda d, _: d._lookahead().used)  # reads it served from fetches
    got = list(DataLoader(tagged, batch_size=None, num_workers=2, timeout=120))
    assert sorted(it["key"] for it in got) == sorted(want)
    for it in got:
        _same(it, want)
        assert it["ahead_in_worker"] == 0  # the DataLoader overlaps a worker's reads already


def _read_through_a_dataloader(ds: HiddenStateDataset, out: multiprocessing.Queue) -> None:
    out.put(sorted(it["key"] for it in DataLoader(ds, batch_size=None, num_workers=1, timeout=120)))


def test_a_process_forked_after_in_order_reads_can_fork_its_own_dataloader_workers(tmp_path: Path):
    """A trainer process forked from one that read in order (e.g. a sanity check of ds[0..2] before
    launching) starts its own DataLoader workers: the fork's gates it inherited must not block it."""
    path, want = _store(tmp_path)
    ds = HiddenStateDataset(path)
    for i in range(3):
        ds[i]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_read_through_a_dataloader, args=(ds, out))
    child.start()
    try:
        assert out.get(timeout=120) == sorted(want)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_datasets_read_through_in_order_keep_no_buffers_for_reading_ahead(tmp_path: Path):
    """Several datasets held at once (eval sets in a dict, a ConcatDataset of stores), each read in order
    to its end in turn: none keeps fetched or spare buffers, nor its fetch thread, once its pass has ended
    (N sets held N budgets and N idle threads)."""
    path, want = _store(tmp_path)
    before = set(_lookahead_threads())
    sets = [HiddenStateDataset(path) for _ in range(3)]
    for ds, order in zip(sets, [range(len(sets[0])), range(len(sets[0]) - 1, -1, -1), range(0, len(sets[0]), 2)]):
        for i in order:
            _same(ds[i], want)
        ahead = ds._lookahead()
        assert ahead.used > 0
        assert (sum(len(b) for b in ahead.free), len(ahead.ahead)) == (0, 0)
    deadline = time.monotonic() + 10  # (a stopped thread ends on its own, after the fetch it may be running)
    while set(_lookahead_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(_lookahead_threads()) - before == set()


def test_datasets_kept_after_reading_a_few_samples_in_order_share_a_few_budgets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Many datasets, each read a little in order and kept (eval sets checked on their first samples): what
    the process holds fetched ahead is bounded, not one budget per dataset (200 such sets held 200 x 64 MiB):
    the least recently read ones let theirs go, and read the ordinary way if they are read again."""
    path, want = _store(tmp_path)
    probe = HiddenStateDataset(path)
    monkeypatch.setattr(prefetch_reads, "AHEAD_BYTES", sum(probe.reader.ref(i).length for i in (3, 4)) * 3 * 32 * 2)
    sets = []
    for _ in range(16):
        ds = HiddenStateDataset(path)
        for i in range(3):  # steady from the second read: the next samples are fetched
            _same(ds[i], want)
        sets.append(ds)
    held = [len(d._lookahead().ahead) + len(d._lookahead().free) for d in sets]
    assert held[-1] > 0  # the one read last still reads ahead ...
    assert held[: len(sets) // 2] == [0] * (len(sets) // 2)  # ... those read longest ago hold nothing
    for i in range(3, len(sets[0])):  # and read on, in order, from where they stopped
        _same(sets[0][i], want)


READ_AT_EXIT = """
import atexit, hashlib, sys
import torch
from hsstore import HiddenStateDataset, StreamingHiddenStateDataset
from hsstore.read import prefetch_reads
from hsstore.storage import reader
from hsstore.storage.local import LocalRange
prefetch_reads.MIN_BYTES, reader.THREAD_MIN_BYTES = 0, 0  # small samples: look ahead and share layers with the pool
LocalRange.cached = lambda self, offset, n: False
ds = HiddenStateDataset(sys.argv[1])
first = [ds[i] for i in range(3)]  # in order: the layer pool and the fetch thread are running

def digest(items) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(it["key"].encode())
        h.update(torch.cat([it["aux_hidden"], it["target_hidden"]], dim=1).view(torch.int16).numpy().tobytes())
    return h.hexdigest()

def read_all() -> None:
    print(digest(ds[i] for i in range(len(ds))), flush=True)
    for prefetch in (0, 2):  # streaming: its readahead thread, and samples read ahead on threads
        print(digest(StreamingHiddenStateDataset(sys.argv[1], shuffle=False, prefetch=prefetch)), flush=True)

atexit.register(read_all)
"""


@pytest.mark.process
def test_reads_from_an_atexit_handler_read_every_item(tmp_path: Path):
    """At interpreter exit thread pools take no new work ("cannot schedule new futures after interpreter
    shutdown"): a handler reading in order (a final evaluation, a flush to another format) must still read,
    on its own thread. A real process: interpreter shutdown is the subject."""
    import hashlib
    import subprocess
    import sys

    path, want = _store(tmp_path)
    h = hashlib.sha256()
    for key in HiddenStateDataset(path).keys:
        h.update(key.encode())
        h.update(want[key].view(torch.int16).numpy().tobytes())
    r = subprocess.run([sys.executable, "-c", READ_AT_EXIT, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Error" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.split() == [h.hexdigest()] * 3


def test_a_pass_from_the_start_fetches_ahead_from_its_first_read(tmp_path: Path):
    """The first read of a dataset at index 0, and index 0 again after a read of the last sample, begin
    a pass in order (as a rule): the next samples are fetched while it is read, not from the second read."""
    path, want = _store(tmp_path)
    ds = HiddenStateDataset(path)
    _same(ds[0], want)
    assert len(ds._lookahead().ahead) > 0
    for i in range(1, len(ds)):
        _same(ds[i], want)
    assert ds._lookahead().used == len(ds) - 1
    _same(ds[0], want)  # the next epoch
    assert len(ds._lookahead().ahead) > 0
    other = HiddenStateDataset(path)
    _same(other[4], want)  # a first read elsewhere: no order known, nothing fetched
    assert len(other._lookahead().ahead) == 0


def test_a_read_with_nothing_fetched_asks_the_kernel_for_all_its_chunks_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A read no fetch served (the first of a pass, a random order) hints every range it is about to read
    to the kernel up front, so a cold sample's layers come from the disk together, not one after another."""
    path, want = _store(tmp_path)
    asked: list[tuple[str, int, int]] = []
    monkeypatch.setattr(LocalRange, "will_need", lambda self, offset, n: asked.append((self.key, offset, n)))
    ds = HiddenStateDataset(path)
    ref = ds.reader.ref(6)
    _same(ds[6], want)
    wanted = {(src.key, offset, n) for src, offset, n in ds.reader.need_spans(ref, LAYERS)}
    assert len(wanted) == 2 + len(LAYERS) and wanted <= set(asked)

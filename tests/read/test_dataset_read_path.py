"""The read path's economy: readahead, one pass per sample, chunks read once, worker outputs in shared memory."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TaggedItems
from helpers import read_path_item_check as _check
from helpers import read_path_store as _store
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset, StreamingHiddenStateDataset
from hsstore.storage import layout
from hsstore.storage import reader as reader_mod
from hsstore.storage.shardio import DECODED


def _readahead_threads(other_than: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hsstore-readahead" and t not in other_than]


def test_streaming_readahead_reads_the_same_epoch_and_stops_its_thread(tmp_path: Path):
    others = frozenset(_readahead_threads())  # an earlier test's, in this worker, that the collector has not reached
    path, want = _store(tmp_path, [[40, 70, 25], [90, 10], [60]])
    epochs = {}
    for readahead in (True, False):
        items = list(StreamingHiddenStateDataset(path, seed=3, readahead=readahead))
        for it in items:
            _check(it, want)
        epochs[readahead] = [it["key"] for it in items]
    assert epochs[True] == epochs[False] and sorted(epochs[True]) == sorted(want)
    it = iter(StreamingHiddenStateDataset(path, seed=3))
    next(it)
    assert len(_readahead_threads(others)) == 1
    it.close()  # a training loop that stops mid-epoch
    assert _readahead_threads(others) == []


def test_a_chunk_holding_many_samples_is_read_and_decoded_once(tmp_path: Path):
    """At a small hidden size one ~1 MiB chunk holds many samples: reading them in order reads its bytes
    once, not once per sample (after its first, checked, read an uncompressed token chunk is read by
    the rows wanted: a sample's own 5 bytes a token)."""
    path, want = _store(tmp_path, [[30, 50, 20, 40, 60, 10]], chunk=4096)
    ds = HiddenStateDataset(path)
    for i in range(len(ds)):
        _check(ds[i], want)
    units = path / "variants" / ds.variant_id / "units"
    on_disk = sum(f.stat().st_size for f in units.rglob("*") if f.is_file() and f.name != "zarr.json")
    tokens = sum(ds.reader.ref(i).length for i in range(len(ds)))
    assert 0 < ds.reader.bytes_read <= on_disk + 5 * tokens


def _held_chunks(ds: HiddenStateDataset) -> int:
    """Decoded chunks of ``ds``'s arrays the process-wide decoded-chunk cache holds."""
    serials = {s.serial for s in ds.reader._shards.values()}
    with DECODED.lock:
        return sum(key[0] in serials for key in DECODED.items)


def test_a_decoded_chunk_goes_once_every_row_of_it_is_read_and_every_order_reads_the_same(tmp_path: Path):
    """Chunks of 16 rows shared by neighbouring samples: an in-order pass holds none of them decoded at its
    end (each went, its memory reused, once its last sample was read); in any order, also with the
    memory of chunks gone being decoded into again, and read from threads at once, items are exact."""
    path, want = _store(tmp_path, [[40, 23, 57, 9, 31, 12, 5, 70], [18, 33, 7]], chunk=16)
    ds = HiddenStateDataset(path)
    n = len(ds)
    for i in range(n):
        _check(ds[i], want)
    assert _held_chunks(ds) == 0
    rng = np.random.default_rng(0)
    for order in (list(range(n))[::-1], [int(i) for i in rng.permutation(n)], [3, 3, 2, 3, 4, 4, 0]):
        for i in order:
            _check(ds[i], want)
    with ThreadPoolExecutor(4) as pool:
        for item in pool.map(ds.__getitem__, [int(i) for i in rng.integers(0, n, 200)]):
            _check(item, want)
    stream = StreamingHiddenStateDataset(path, prefetch=4, seed=1)
    for epoch in range(3):
        stream.set_epoch(epoch)
        assert sorted(_check(it, want) or it["key"] for it in stream) == sorted(want)


def test_small_samples_are_read_in_the_calling_thread_and_large_ones_side_by_side(tmp_path: Path):
    rows = reader_mod.THREAD_MIN_BYTES // (3 * 256 * 2) + 8  # one sample of 3 layers at hidden 256 above it
    path, want = _store(tmp_path, [[20, rows]], hidden=256, chunk=64)
    ds = HiddenStateDataset(path)
    small = next(i for i in range(len(ds)) if ds.reader.ref(i).length == 20)
    _check(ds[small], want)
    assert ds.reader._pool is None  # no thread was started for a small sample
    _check(ds[1 - small], want)
    assert ds.reader._pool is not None or ds.reader.read_threads < 2


def _made_shared(ds: HiddenStateDataset, item: dict[str, Any]) -> bool:
    """Whether the item's states were already in shared memory where they were read."""
    return all(item[k].is_shared() for k in ("aux_hidden", "target_hidden"))


def test_dataloader_workers_decode_into_shared_memory(tmp_path: Path):
    """A worker's item reaches the main process without a copy into shared memory on the way."""
    path, want = _store(tmp_path, [[40, 70], [25]])
    ds = HiddenStateDataset(path)
    tagged = TaggedItems(ds, "made_shared", _made_shared)
    assert not tagged[0]["made_shared"]  # in the main process: ordinary memory
    got = list(DataLoader(tagged, batch_size=None, num_workers=1))
    assert len(got) == len(ds) and all(it["made_shared"] for it in got)
    for it in got:
        _check(it, want)


@pytest.mark.parametrize("codec", ["none", "shuffle-zstd"])
def test_a_flipped_byte_in_a_strided_layer_slot_is_still_caught(tmp_path: Path, codec: str):
    """Chunks read through the scratch buffer are checked before they land in the [T, n, H] slot."""
    path, _ = _store(tmp_path, [[40, 70]], codec=codec, chunk=32)
    ds = HiddenStateDataset(path)
    vid, unit = ds.variant_id, ds.reader.ref(0).unit
    f = path / "variants" / vid / "units" / unit / layout.layer_array(1) / "c" / "0" / "0"
    data = bytearray(f.read_bytes())
    data[10] ^= 0x40
    f.write_bytes(bytes(data))
    from hsstore.core.errors import CorruptData

    with pytest.raises(CorruptData, match="crc32c|checksum"):
        for i in range(len(HiddenStateDataset(path))):
            HiddenStateDataset(path)[i]


def test_a_random_sample_at_a_small_hidden_size_reads_little_beyond_its_own_rows(tmp_path: Path):
    """With the chunking a build picks (codecs.chunk_tokens), one sample read from the middle of a unit
    of many short samples at hidden 64 reads a few times its own bytes, not a ~1 MiB chunk per layer
    that holds ten other samples."""
    from hsstore.storage.codecs import DEFAULT, chunk_tokens

    hidden, length = 64, 700
    path, want = _store(tmp_path, [[length] * 12], hidden=hidden, codec=DEFAULT, chunk=chunk_tokens(hidden, 2))
    ds = HiddenStateDataset(path)
    _check(ds[6], want)
    own = length * 3 * hidden * 2  # the sample's raw bf16 states, 3 layers
    tokens = 12 * length * 5  # the unit's token arrays, checked whole on their first read
    assert ds.reader.bytes_read <= 4 * own + tokens + 4096


def test_dataloader_workers_share_the_read_threads(tmp_path: Path):
    """Each of W workers decodes on its share of the threads one process would use, not on all of them."""
    rows = reader_mod.THREAD_MIN_BYTES // (3 * 256 * 2) + 8
    path, want = _store(tmp_path, [[rows]], hidden=256, chunk=64)
    ds = HiddenStateDataset(path)
    ds.reader.read_threads = 4
    got = list(
        DataLoader(TaggedItems(ds, "pool_threads", lambda d, _: d.reader._pool_threads), batch_size=None, num_workers=2)
    )
    _check(got[0], want)
    assert got[0]["pool_threads"] == 2

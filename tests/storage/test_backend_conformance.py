"""The storage-conformance suite (in the spirit of zarr.testing.store.StoreTests): one set of tests that
every back end of the storage seam passes — a local directory, zarr's MemoryStore, fsspec's memory://
and S3 (a moto server on loopback) — first the interface, then a whole store on top of it."""

from __future__ import annotations

import uuid
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch
import xxhash
from helpers import new_variant, write_unit
from zarr.storage import MemoryStore

from hsstore import Store
from hsstore.core.errors import CorruptData
from hsstore.storage.backend import Backend
from hsstore.storage.fileio import digest
from hsstore.storage.gc import collect_garbage
from hsstore.storage.local import LocalBackend
from hsstore.storage.remote import ZarrBackend
from hsstore.storage.verify import verify

KINDS = ["local", "zarr-memory", "fsspec-memory", "s3"]


@pytest.fixture(params=KINDS)
def io(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind = request.param
    if kind == "local":
        (tmp_path / "b").mkdir()
        return LocalBackend(str(tmp_path / "b"))
    if kind == "zarr-memory":
        return ZarrBackend(MemoryStore(), "zarr MemoryStore")
    if kind == "fsspec-memory":
        return ZarrBackend.from_url(f"memory://conformance-{uuid.uuid4().hex[:8]}", read_only=False)
    return ZarrBackend.from_url(f"{request.getfixturevalue('s3')}/{uuid.uuid4().hex[:8]}", read_only=False)


# ---- the interface ------------------------------------------------------------------------------------


def test_a_missing_key(io: Backend):
    assert io.get("a/b.json") is None and io.size("a/b.json") is None and io.checksum("a/b.json", "xxh3") is None
    assert not io.exists("a/b.json") and io.list("a/") == [] and io.list_dir("a") == []
    with pytest.raises(FileNotFoundError):
        io.open_range("a/b.json")
    io.remove("a/b.json")  # absent is fine
    assert io.remove_tree("a") == 0


def test_put_writes_every_buffer_and_reports_size_and_checksum(io: Backend):
    parts = [b"abc", memoryview(bytearray(b"defg")), np.arange(100, dtype="<u2"), b""]
    w = io.put("x/y/z", parts)
    assert w == digest(parts) and w.size == 3 + 4 + 200
    assert io.get("x/y/z") == b"abcdefg" + np.arange(100, dtype="<u2").tobytes()
    assert io.size("x/y/z") == w.size and io.checksum("x/y/z", "xxh3") == w.xxh3 and io.exists("x/y/z")


def test_get_refuses_an_object_larger_than_its_cap(io: Backend):
    io.put("big", [b"x" * 100])
    assert io.get("big", cap=100) == b"x" * 100
    with pytest.raises(CorruptData, match="big"):
        io.get("big", cap=99)


def test_put_atomic_replaces_and_put_if_absent_does_not(io: Backend):
    io.put_atomic("r.json", b"1")
    io.put_atomic("r.json", b"22")
    assert io.get("r.json") == b"22"
    assert io.put_if_absent("once.json", b"first") is True
    assert io.put_if_absent("once.json", b"second") is False
    assert io.get("once.json") == b"first"


def test_ranges(io: Backend):
    data = bytes(range(256)) * 4
    io.put("s/c/0/0", [data])
    src = io.open_range("s/c/0/0")
    try:
        assert src.size == len(data)
        assert src.read(10, 5) == data[10:15] and src.read(1020, 100) == data[1020:]
        a, b = bytearray(3), bytearray(4)
        assert src.readinto([memoryview(a), memoryview(b)], 100) == 7 and bytes(a + b) == data[100:107]
        assert src.checksum("xxh3") == digest([data]).xxh3 == xxhash.xxh3_64_hexdigest(data)
        assert src.checksum("crc32c") == f"{crc32c.crc32c(data):08x}"  # (records of before 2026-12-07)
    finally:
        src.close()


def test_listing(io: Backend):
    for k in ("v/a/zarr.json", "v/a/c/0", "v/b/zarr.json", "v/bb.json", "w/x"):
        io.put(k, [k.encode()])
    io.put("v/a/.tmp-0123", [b"half a put"])
    assert io.list("v/") == ["v/a/c/0", "v/a/zarr.json", "v/b/zarr.json", "v/bb.json"]  # temp objects never
    assert io.list("v/a/") == ["v/a/c/0", "v/a/zarr.json"]
    assert io.list_dir("v") == ["a", "b", "bb.json"]
    files = {e.key for e in io.entries() if e.kind == "file"}
    assert {"v/a/zarr.json", "v/a/c/0", "v/b/zarr.json", "v/bb.json", "w/x"} <= files
    assert all(e.kind in ("file", "dir") and not e.executable for e in io.entries())


def test_removal_stays_inside_its_prefix(io: Backend):
    for k in ("u/1/zarr.json", "u/1/c/0", "u/10/zarr.json", "u/2/zarr.json"):
        io.put(k, [b"x"])
    assert io.remove_tree("u/1") == 2
    assert io.list("u/") == ["u/10/zarr.json", "u/2/zarr.json"]
    io.remove("u/2/zarr.json")
    assert io.list("u/") == ["u/10/zarr.json"]


# ---- a whole store on each back end -------------------------------------------------------------------


def test_a_store_round_trips_verifies_and_detects_damage(io: Backend):
    store = Store.create(io)
    vid = new_variant(store, hidden=16, chunk=8, codec="shuffle-zstd")
    samples, states = write_unit(store, vid, [9, 20, 3], seed=7, writer_id="w")
    reader = Store.open(io).reader(vid)
    assert reader.keys == [s.key for s in samples]
    got = reader.read_stacked(reader.ref(samples[1].key), [0, 2])
    assert torch.equal(got[:, 1], states[2][9:29]) and torch.equal(got[:, 0], states[0][9:29])
    assert verify(Store.open(io)).ok
    assert collect_garbage(Store.open(io, mode="a"), force=True, dry_run=True).removed_units == []
    key = f"variants/{vid}/units/w-000000/layer_1/c/0/0"
    raw = bytearray(io.get(key, cap=1 << 30))
    raw[len(raw) // 3] ^= 0x10
    io.put(key, [bytes(raw)])  # same size, other bytes: the chunk crc32c and the commit's xxh3 catch it
    result = verify(Store.open(io))
    assert not result.ok and {p.key for p in result.problems} == {s.key for s in samples}


def test_an_object_store_reads_a_samples_chunks_in_one_request(monkeypatch: pytest.MonkeyPatch):
    """Each GET is a round trip: the chunks of one sample's layer come in one ranged GET, not one each."""
    io = ZarrBackend(MemoryStore(), "zarr MemoryStore")
    store = Store.create(io)
    vid = new_variant(store, hidden=16, chunk=4, codec="zstd")
    _, states = write_unit(store, vid, [40, 37], seed=3)
    reader = Store.open(io).reader(vid)
    reader.read_layers(reader.ref(0), [1])  # opens the array: metadata and shard index
    calls = []
    real = io.get_range
    monkeypatch.setattr(io, "get_range", lambda *a: calls.append(a) or real(*a))
    got = reader.read_layers(reader.ref(1), [1])[0]  # rows 40..77: 11 chunks of 4 rows
    assert len(calls) == 1 and torch.equal(got, states[1][40:])

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LAYERS, REPO, TORCH_DTYPES, make_samples, make_states, new_variant, provenance

from hsstore import Store
from hsstore.core.errors import BadInput, CorruptData, StoreNotFound, UnsupportedFormat
from hsstore.core.provenance_match import variant_id
from hsstore.storage.codecs import compressors
from hsstore.storage.reader import commit_order
from hsstore.storage.verify import verify
from hsstore.storage.writer import UnitWriter


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("codec", ["none", "zstd", "shuffle-zstd", "blosc-lz4"])
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: str, codec: str):
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store, dtype=dtype, codec=codec, layers={"aux": [0, 1], "target": [2]})
    samples = make_samples([1, 7, 10_000, 129, 64])
    states = make_states(samples, 16, dtype, [0, 1, 2])
    UnitWriter(store, vid).write(samples, states)
    reader = Store.open(tmp_path / "s.zarr").reader(vid)
    off = 0
    for s in samples:
        got = reader.read(s.key, layers=[2, 0])  # any subset, any order
        assert got["layers"][2].dtype == states[2].dtype
        assert torch.equal(
            got["layers"][2].view(torch.int16 if dtype != "fp32" else torch.int32),
            states[2][off : off + s.length].view(torch.int16 if dtype != "fp32" else torch.int32),
        )
        assert torch.equal(got["layers"][0], states[0][off : off + s.length])
        assert np.array_equal(got["input_ids"].numpy(), s.input_ids)
        off += s.length
    assert reader.n_tokens == sum(s.length for s in samples)


def test_bf16_reads_back_as_bfloat16_without_float_copy(tmp_path: Path):
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    samples = make_samples([5])
    states = make_states(samples, 16, "bf16", [0, 1, 2])
    states[0][0, 0] = float("1e-40")  # a bf16 subnormal survives only if no float path rounds it
    UnitWriter(store, vid).write(samples, states)
    meta = json.loads(
        (tmp_path / "s.zarr" / f"variants/{vid}/units").glob("*/layer_0/zarr.json").__next__().read_text()
    )
    assert meta["data_type"] == "uint16" and meta["attributes"]["hsstore_dtype"] == "bf16"
    t = Store.open(tmp_path / "s.zarr").reader(vid).read(0, layers=[0])["layers"][0]
    assert t.dtype == torch.bfloat16 and torch.equal(t.view(torch.int16), states[0].view(torch.int16))


def test_uncommitted_work_is_invisible_and_rewrite_is_noop(tmp_path: Path):
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    samples = make_samples([3, 4])
    w = UnitWriter(store, vid)
    # a unit whose arrays are written but whose commit record is not: a crash just before commit
    w._write_unit(samples, make_states(samples, 16, "bf16", [0, 1, 2]), {})
    commit = next((path / f"variants/{vid}/commits").glob("*.json"))
    commit.unlink()
    fresh = Store.open(path)
    assert fresh.variants == []
    assert verify(fresh).ok and verify(fresh).samples_checked == 0
    c1 = UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))
    assert c1 is not None and len(c1.samples) == 2
    assert UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2], seed=9)) is None
    more = make_samples([3, 4, 5], seed=0)  # the first two again plus one new: only the new one is written
    c3 = UnitWriter(store, vid).write(more, make_states(more, 16, "bf16", [0, 1, 2]))
    assert [k for k, _, _ in c3.samples] == [more[2].key]
    assert len(Store.open(path).reader(vid).keys) == 3


def _write_disjoint(path: str, vid: str, seed: int) -> None:
    store = Store.open(path, mode="a")
    for j in range(3):
        samples = make_samples([20, 30], seed=seed * 100 + j)
        UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))


def _write_same(path: str, vid: str, seed: int) -> None:
    store = Store.open(path, mode="a")
    samples = make_samples([20, 30, 40, 50], seed=7)
    UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2], seed=seed), skip_committed=False)


def _in_two_processes(target, path: str, vid: str) -> None:
    """Run ``target(path, vid, seed)`` in two real spawned processes at once; both must succeed."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(path, vid, seed)) for seed in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]


@pytest.mark.process
def test_two_processes_disjoint_units_lose_nothing(tmp_path: Path):
    path = str(tmp_path / "s.zarr")
    vid = new_variant(Store.create(path))
    _in_two_processes(_write_disjoint, path, vid)
    reader = Store.open(path).reader(vid)
    assert len(reader.keys) == 12 and len(set(reader.keys)) == 12
    assert verify(Store.open(path)).ok


@pytest.mark.process
def test_racing_writers_never_show_a_sample_twice(tmp_path: Path):
    path = str(tmp_path / "s.zarr")
    vid = new_variant(Store.create(path))
    _in_two_processes(_write_same, path, vid)
    reader = Store.open(path).reader(vid)
    assert len(reader.commits) == 2  # both committed their unit...
    assert len(reader.keys) == 4  # ...but each sample is visible once, from the first unit committed
    winner = commit_order({c.unit: c for c in reader.commits})[0]
    assert {r.unit for r in reader.refs.values()} == {winner}
    assert verify(Store.open(path)).ok


def test_memory_url_store_round_trip():
    store = Store.create("memory://hsstore-test/s.zarr")
    vid = new_variant(store)
    samples = make_samples([9, 2])
    states = make_states(samples, 16, "bf16", [0, 1, 2])
    UnitWriter(store, vid).write(samples, states)
    reader = Store.open("memory://hsstore-test/s.zarr").reader(vid)
    assert torch.equal(reader.read(samples[1].key)["layers"][1], states[1][9:])


def test_open_errors(tmp_path: Path):
    with pytest.raises(StoreNotFound, match="no store at"):
        Store.open(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="is a file"):
        Store.open(tmp_path / "file")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.txt").write_text("x")
    with pytest.raises(StoreNotFound, match="not an hsstore store"):
        Store.open(tmp_path / "plain")
    with pytest.raises(BadInput, match="non-empty directory"):
        Store.create(tmp_path / "plain")
    s = tmp_path / "future.zarr"
    Store.create(s)
    meta = json.loads((s / "zarr.json").read_text())
    meta["attributes"]["hsstore"]["format_version"] = "2.0"
    (s / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(UnsupportedFormat, match="format version 2.0"):
        Store.open(s)


def test_layer_subset_reads_fewer_bytes(tmp_path: Path):
    path = str(tmp_path / "s.zarr")
    store = Store.create(path)
    vid = new_variant(store, hidden=64)
    samples = make_samples([300] * 4)
    UnitWriter(store, vid).write(samples, make_states(samples, 64, "bf16", [0, 1, 2]))

    def bytes_for(layers: list[int]) -> int:
        r = Store.open(path).reader(vid)
        before = r.bytes_read
        for k in r.keys:
            r.read_layers(r.refs[k], layers)
        return r.bytes_read - before

    one, three = bytes_for([2]), bytes_for([0, 1, 2])
    assert 0 < one < 0.4 * three, (one, three)


def test_direct_shards_and_zarr_agree(tmp_path: Path):
    """hsstore's direct shard writer/reader and zarr-python read and write the same bytes."""
    import zarr

    from hsstore.storage.local import LocalBackend
    from hsstore.storage.shardio import ShardReader

    for codec in ("none", "zstd", "shuffle-zstd", "blosc-lz4", "blosc-zstd"):
        store = Store.create(tmp_path / f"{codec}.zarr")
        vid = new_variant(store, hidden=24, codec=codec, chunk=7)
        samples = make_samples([5, 17, 1])
        states = make_states(samples, 24, "bf16", [0, 1, 2])
        UnitWriter(store, vid).write(samples, states)
        unit = next((tmp_path / f"{codec}.zarr" / "variants" / vid / "units").glob("*-*"))
        via_zarr = zarr.open_array(str(unit / "layer_1"), mode="r")[:]
        assert np.array_equal(via_zarr, states[1].view(torch.int16).numpy().view(np.uint16)), codec
        direct = ShardReader(LocalBackend(str(unit)), "layer_1", f"{codec} layer_1").rows(3, 20)
        assert np.array_equal(direct, via_zarr[3:20])
        assert np.array_equal(
            zarr.open_array(str(unit / "input_ids"), mode="r")[:], np.concatenate([s.input_ids for s in samples])
        )
        # and a shard written by zarr is read by the direct reader
        z = zarr.create_array(
            str(tmp_path / f"z-{codec}"),
            shape=(23, 24),
            chunks=(7, 24),
            shards=(28, 24),
            dtype="uint16",
            compressors=compressors(codec),
        )
        z[:] = via_zarr
        assert np.array_equal(
            ShardReader(LocalBackend(str(tmp_path)), f"z-{codec}", f"zarr's {codec} array").rows(0, 23), via_zarr
        )


def test_store_holds_only_json_and_numeric_chunks(tiny_store: Path):
    files = [f for f in tiny_store.rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {"zarr.json", "0"}  # records and chunk shards, of a store that exists
    for f in files:
        data = f.read_bytes()
        assert not data.startswith(b"\x80"), f"{f} looks like a pickle"
        if f.suffix == ".json" or f.name == "zarr.json":
            json.loads(data)


def test_format_v1_fixture_still_reads():
    """A store of format 1.0 committed in the repo: a change that breaks old stores fails here."""
    fixture = REPO / "tests" / "data" / "format-v1.zarr"
    expected = json.loads((REPO / "tests" / "data" / "format-v1.expected.json").read_text())
    store = Store.open(fixture)
    assert store.format_version == "1.0"
    assert sorted(expected) == sorted(store.variant_ids()) and len(expected) == 2  # every variant is checked
    for vid, want in expected.items():
        r = store.reader(vid)
        assert len(r.keys) == want["n_samples"]
        for key, sums in want["layer_sums"].items():
            got = r.read(key)
            for layer, total in sums.items():
                assert float(got["layers"][int(layer)].double().sum()) == total
    assert verify(store).ok
    for vid in expected:  # the typed view reads old provenance and leaves the stored dict (the id hashes it) alone
        rec = store.variant_record(vid)
        assert rec.prov.environment.dtype == rec.dtype and rec.prov.recipe.layers.target == [2]
        assert rec.prov.to_dict() == rec.provenance and variant_id(rec.provenance) == vid


def test_provenance_that_does_not_fit_the_schema_is_one_line(tmp_path: Path):
    """Written: refused before anything is stored (BadInput). Read: CorruptData naming the variant and field."""
    store = Store.create(tmp_path / "s.zarr")
    bad = provenance()
    bad["recipe"]["tokenizer"]["fingerprint"] = 7
    with pytest.raises(BadInput, match=r"^variant provenance: recipe.tokenizer.fingerprint = 7: expected a string"):
        store.create_variant(bad, LAYERS, 16, "bf16", "zstd", 64)
    assert store.variant_ids() == []
    vid = new_variant(store)
    meta = tmp_path / "s.zarr" / "variants" / vid / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["hsstore_variant"]["provenance"]["environment"]["kernels"]["attention"] = ["sdpa"]
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptData, match=rf"^variant {vid}: provenance: environment.kernels.attention = \['sdpa'\]"):
        _ = Store.open(tmp_path / "s.zarr").variant_record(vid).prov


@pytest.mark.parametrize("codec,dtype,words", [("x", "bf16", "codec 'x'"), ("zstd", "int8", "dtype 'int8'")])
def test_a_variant_no_reader_could_open_is_refused_before_anything_is_written(tmp_path: Path, codec, dtype, words):
    """create_variant checks codec and dtype as reading does, so it never leaves a variant record behind
    that every reader then refuses as corrupt."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    with pytest.raises(BadInput, match=words):
        store.create_variant(provenance(), LAYERS, 16, dtype, codec, 64)
    assert [c for c in (path / "variants").iterdir() if c.is_dir()] == []
    assert verify(Store.open(path)).ok


def test_nan_inf_and_all_zero_states_are_refused_before_commit(tmp_path: Path):
    from hsstore.core.errors import BuildFailed

    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    samples = make_samples([4, 6])
    bad = make_states(samples, 16, "bf16", [0, 1, 2])
    bad[1][2, 3] = float("nan")
    with pytest.raises(BuildFailed, match="layer 1 .*1 NaN"):
        UnitWriter(store, vid).write(samples, bad)
    zero = make_states(samples, 16, "bf16", [0, 1, 2])
    zero[2][4:] = 0  # the second sample's target layer is all zeros: a broken extractor
    with pytest.raises(BuildFailed, match=f"sample {samples[1].key}: layer 2 is all zeros"):
        UnitWriter(store, vid).write(samples, zero)
    assert Store.open(tmp_path / "s.zarr").variants == []
    UnitWriter(store, vid, check_health=False).write(samples, zero)  # the user opted out
    assert Store.open(tmp_path / "s.zarr").variants[0].n_samples == 2


def test_gc_removes_only_uncommitted_debris(tmp_path: Path):
    from hsstore.storage.gc import collect_garbage

    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    kept = make_samples([3], seed=1)
    UnitWriter(store, vid).write(kept, make_states(kept, 16, "bf16", [0, 1, 2]))
    debris = make_samples([4], seed=2)
    w = UnitWriter(store, vid, writer_id="crashed")
    w._write_unit(debris, make_states(debris, 16, "bf16", [0, 1, 2]), {})
    next((path / f"variants/{vid}/commits").glob("crashed-*.json")).unlink()  # it died before committing
    (path / f"variants/{vid}/commits/.tmp-123").write_bytes(b"half a commit")
    r = collect_garbage(Store.open(path, mode="a"))
    assert r.removed_units == [] and len(r.kept_in_progress) == 1  # its writer (this process) is alive
    r = collect_garbage(Store.open(path, mode="a"), force=True)
    assert len(r.removed_units) == 1 and not list((path / f"variants/{vid}/units").glob("crashed-*"))
    assert not (path / f"variants/{vid}/commits/.tmp-123").exists()
    s = Store.open(path)
    assert s.reader(vid).keys == [kept[0].key] and verify(s).ok


def test_two_writers_with_one_id_cannot_share_a_unit(tmp_path: Path):
    from hsstore.core.errors import BuildFailed

    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    a, b = make_samples([3], seed=1), make_samples([4], seed=2)
    UnitWriter(store, vid, writer_id="same").write(a, make_states(a, 16, "bf16", [0, 1, 2]))
    with pytest.raises(BuildFailed, match="exists already"):
        UnitWriter(store, vid, writer_id="same").write(b, make_states(b, 16, "bf16", [0, 1, 2]))
    r = Store.open(tmp_path / "s.zarr").reader(vid)
    assert r.keys == [a[0].key] and verify(Store.open(tmp_path / "s.zarr")).ok


def test_the_default_codec_stores_bf16_states_smaller_than_plain_zstd(tmp_path: Path):
    """Why shuffle-zstd is the default: byte planes make the sign/exponent bytes compressible."""
    from hsstore.storage.codecs import DEFAULT, chunk_tokens

    assert DEFAULT == "shuffle-zstd"
    hidden, layers = 512, {"aux": [0], "target": [1]}
    samples = make_samples([1500, 900])
    g = torch.Generator().manual_seed(0)
    scale = torch.exp(torch.randn(hidden, generator=g))  # per-channel scales, like a residual stream
    states = {i: (torch.randn(2400, hidden, generator=g) * scale).to(torch.bfloat16) for i in (0, 1)}
    size = {}
    for codec in ("zstd", DEFAULT):
        store = Store.create(tmp_path / f"{codec}.zarr")
        vid = new_variant(store, hidden=hidden, codec=codec, chunk=chunk_tokens(hidden, 2), layers=layers)
        UnitWriter(store, vid).write(samples, states)
        size[codec] = sum(f.stat().st_size for f in (tmp_path / f"{codec}.zarr").rglob("layer_*/c/*/*"))
        got = Store.open(tmp_path / f"{codec}.zarr").reader(vid).read(samples[1].key, [1])["layers"][1]
        assert torch.equal(got, states[1][1500:])
    assert size[DEFAULT] < 0.95 * size["zstd"], size


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_numpy_health_stats_equal_the_writers(dtype: str):
    """verify judges stored values with numpy (array_stats); the writer with torch (layer_stats): same verdicts."""
    from hsstore.core.dtypes import as_float32, to_stored
    from hsstore.storage.stats import array_stats, layer_stats, problems

    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 24, generator=g)
    x[3, 4], x[5, 6], x[7, 8], x[9, :] = float("nan"), float("inf"), float("-inf"), 0.0
    for t in (x, torch.zeros(4, 8), torch.full((4, 8), 2.5), torch.randn(6, 8, generator=g)):
        t = t.to(TORCH_DTYPES[dtype])
        a, b = layer_stats(t), array_stats(as_float32(to_stored(t), dtype))
        exact = ("n", "absmax", "min", "max", "nan", "inf", "zeros")
        assert {k: a[k] for k in exact} == {k: b[k] for k in exact}
        assert b["sum"] == pytest.approx(a["sum"], rel=1e-5, abs=1e-3)
        assert b["sumsq"] == pytest.approx(a["sumsq"], rel=1e-5)
        assert problems(a) == problems(b)

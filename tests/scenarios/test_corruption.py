"""Corruption suite: each kind of damage is named by verify (exit 1, sample named) and by reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import run_cli, store_with_unit

from hsstore import HiddenStateDataset, Store
from hsstore.core.errors import CorruptData
from hsstore.storage.verify import verify


@pytest.fixture
def store_path(tmp_path: Path) -> tuple[Path, str, list]:
    path = tmp_path / "s.zarr"
    _, vid, samples, _ = store_with_unit(path, [40, 25, 60], seed=3, hidden=32, chunk=16)
    return path, vid, samples


def _unit_dir(path: Path, vid: str) -> Path:
    return next((path / "variants" / vid / "units").glob("w-*"))


def _read_all(path: Path, vid: str) -> None:
    r = Store.open(path).reader(vid)
    r.check_corrupt_commits()
    for k in r.keys:
        r.read(k)


def _assert_detected(path: Path, vid: str, samples: list, match: str) -> None:
    result = verify(Store.open(path))
    assert not result.ok
    named = {p.key for p in result.problems}
    assert named & {s.key for s in samples}, result.problems
    with pytest.raises(CorruptData, match=match):
        _read_all(path, vid)
    cli = run_cli("verify", str(path), "--json")
    assert cli.returncode == 1
    assert json.loads(cli.stdout)["ok"] is False


@pytest.mark.parametrize("target", ["layer_1/c/0/0", "input_ids/c/0", "loss_mask/c/0"])
@pytest.mark.parametrize("where", [0.1, 0.5, 0.95])
def test_flipped_byte_in_any_chunk_file(store_path, target: str, where: float):
    path, vid, samples = store_path
    f = _unit_dir(path, vid) / target
    data = bytearray(f.read_bytes())
    data[int(len(data) * where)] ^= 0x40
    f.write_bytes(bytes(data))
    result = verify(Store.open(path))
    assert not result.ok
    assert {p.key for p in result.problems} & {s.key for s in samples}
    with pytest.raises(CorruptData):
        _read_all(path, vid)


def test_truncated_chunk(store_path):
    path, vid, samples = store_path
    f = _unit_dir(path, vid) / "layer_0/c/0/0"
    f.write_bytes(f.read_bytes()[:-100])
    _assert_detected(path, vid, samples, "bytes, .* were committed")


def test_zero_length_chunk(store_path):
    path, vid, samples = store_path
    (_unit_dir(path, vid) / "layer_2/c/0/0").write_bytes(b"")
    _assert_detected(path, vid, samples, "has 0 bytes")


def test_deleted_chunk_file(store_path):
    path, vid, samples = store_path
    (_unit_dir(path, vid) / "layer_2/c/0/0").unlink()
    _assert_detected(path, vid, samples, "is missing")


def test_commit_pointing_at_missing_data(store_path):
    path, vid, samples = store_path
    shutil.rmtree(_unit_dir(path, vid) / "layer_1")
    _assert_detected(path, vid, samples, "missing")


def test_garbage_commit_record(store_path):
    path, vid, _ = store_path
    commit = next((path / "variants" / vid / "commits").glob("*.json"))
    commit.write_text("{not json")
    result = verify(Store.open(path))
    assert not result.ok and "unreadable" in result.problems[0].what
    assert Store.open(path).variant_ids() == [vid]
    with pytest.raises(CorruptData, match="unreadable commit record"):
        _read_all(path, vid)


def test_deleted_commit_record_hides_the_unit(store_path):
    path, vid, samples = store_path
    next((path / "variants" / vid / "commits").glob("*.json")).unlink()
    store = Store.open(path)
    assert store.variants == []  # the unit is uncommitted now: invisible, and gc can reclaim it
    result = verify(store)
    assert result.ok and any("uncommitted" in n for n in result.notes)


def test_garbage_variant_metadata(store_path):
    path, vid, _ = store_path
    (path / "variants" / vid / "zarr.json").write_text("\x00garbage")
    with pytest.raises(CorruptData, match="not valid JSON"):
        Store.open(path).reader(vid)
    assert run_cli("info", str(path)).returncode == 1


def test_stray_file_is_flagged(store_path):
    path, vid, _ = store_path
    (path / "variants" / vid / "evil.py").write_text("import os")
    result = verify(Store.open(path))
    assert not result.ok
    assert "not written by hsstore" in result.problems[0].what


def test_flipped_byte_in_an_uncompressed_chunk_read_straight_into_the_output(tmp_path: Path):
    from hsstore import HiddenStateDataset

    path = tmp_path / "s.zarr"
    _, vid, samples, _ = store_with_unit(path, [64], seed=5, hidden=32, chunk=16, codec="none")
    f = _unit_dir(path, vid) / "layer_0/c/0/0"
    data = bytearray(f.read_bytes())
    data[40 * 64 + 7] ^= 0x01  # inside the third whole chunk of 16 rows x 64 bytes (+4 crc each)
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match=f"sample {samples[0].key}.*crc32c"):
        HiddenStateDataset(path)[0]
    assert not verify(Store.open(path)).ok


def test_a_changed_metadata_file_fails_its_recorded_checksum(store_path):
    """Array metadata has no chunk checksum of its own: the commit's xxh3 of every file catches it."""
    path, vid, samples = store_path
    meta = _unit_dir(path, vid) / "layer_1" / "zarr.json"
    text = meta.read_text()
    meta.write_text(text.replace('"layer": 1', '"layer": 7'))  # same size, other bytes
    assert meta.stat().st_size == len(text)
    result = verify(Store.open(path))
    assert not result.ok and "layer_1/zarr.json has xxh3" in result.problems[0].what
    assert {p.key for p in result.problems} == {s.key for s in samples}


@pytest.mark.parametrize("forged", ["sample-length", "chunk-rows"])
def test_records_forged_to_declare_huge_shapes_are_refused_before_allocating(store_path, forged: str):
    """A store whose records are rewritten consistently (commit, array metadata and their recorded xxh3) to
    declare a sample of 10^15 tokens, or one chunk of 10^15 rows: reads and verify name it in one line (it
    is more than any machine's memory) instead of allocating petabytes (MemoryError) or a reshape traceback."""
    import xxhash

    path, vid, samples = store_path
    unit = _unit_dir(path, vid)
    commit_file = path / "variants" / vid / "commits" / f"{unit.name}.json"
    commit = json.loads(commit_file.read_text())
    huge = 10**15
    if forged == "sample-length":
        commit["samples"][-1][2] = huge
    total = commit["samples"][-1][1] + commit["samples"][-1][2]
    for arr in ["input_ids", "loss_mask", *(f"layer_{i}" for i in commit["layers"])]:
        meta_file = unit / arr / "zarr.json"
        meta = json.loads(meta_file.read_text())
        rows = total if forged == "sample-length" else meta["shape"][0]
        meta["shape"][0] = rows
        meta["chunk_grid"]["configuration"]["chunk_shape"][0] = huge if forged == "chunk-rows" else rows
        if meta["codecs"][0]["name"] == "sharding_indexed":  # one chunk of all rows: no index to give it away
            meta["codecs"][0]["configuration"]["chunk_shape"][0] = huge if forged == "chunk-rows" else rows
        data = json.dumps(meta).encode()
        meta_file.write_bytes(data)
        commit["files"][f"{arr}/zarr.json"] = len(data)
        commit["xxh3"][f"{arr}/zarr.json"] = xxhash.xxh3_64_hexdigest(data)
    commit_file.write_text(json.dumps(commit))
    result = verify(Store.open(path))
    assert not result.ok and result.problems, result
    assert all("more than this machine's" in p.what for p in result.problems), result.problems
    with pytest.raises(
        CorruptData, match="declares .*, more than this machine's .* of memory: its records are damaged"
    ):
        _read_all(path, vid)


@pytest.mark.parametrize("damage", ["delete", "flip", "record"])
def test_a_damaged_unit_is_quarantined_and_the_build_that_wrote_it_recomputes_its_samples(tmp_path: Path, damage: str):
    """verify names a fix that is not itself, ``verify --quarantine`` takes back the damaged unit's commit (its
    record kept under quarantine/, its files left to gc) and only that unit's, and re-running the build writes its
    samples again: verify is clean and every sample reads (a rebuild said "all present" and left them unreadable)."""
    from helpers import write_manifest

    m = write_manifest(tmp_path / "m.toml", dtypes='["bf16"]')
    m.write_text(
        m.read_text()
        .replace("unit_tokens = 2048", "unit_tokens = 64")  # a unit a batch of a few samples
        .replace("token_budget = 2048", "token_budget = 256")
    )
    assert run_cli("build", str(m), "--limit", "6", "--quiet").returncode == 0
    path = tmp_path / "store.zarr"
    (vid,) = Store.open(path).variant_ids()
    before = sorted(Store.open(path).reader(vid).keys)
    units = sorted((path / "variants" / vid / "units").glob("r0-*"))
    assert len(units) > 1
    chunk = units[0] / "layer_1/c/0/0"
    if damage == "delete":
        chunk.unlink()
    elif damage == "record":  # its commit record: the whole variant was unreadable, and nothing recovered it
        (path / "variants" / vid / "commits" / f"{units[0].name}.json").write_text('{"unit": "cut sh')
    else:
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0x40
        chunk.write_bytes(bytes(data))
    r = run_cli("verify", str(path))
    assert r.returncode == 1 and "Run `hsstore verify`" not in r.stdout
    assert "hsstore verify STORE --quarantine" in r.stdout, r.stdout
    r = run_cli("verify", str(path), "--quarantine", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["quarantined"] == [f"{vid}/{units[0].name}"]
    assert (path / "variants" / vid / "quarantine" / f"{units[0].name}.json").exists()
    kept = sorted(Store.open(path).reader(vid).keys)
    assert len(kept) < len(before) and set(kept) < set(before)  # the other units' samples stay committed
    assert run_cli("verify", str(path)).returncode == 0  # the taken-back unit is debris now, and its record known
    r = run_cli("build", str(m), "--limit", "6", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["variants"][0]["samples_written"] == len(before) - len(kept)
    assert run_cli("verify", str(path)).returncode == 0
    reader = Store.open(path).reader(vid)
    assert sorted(reader.keys) == before
    for k in reader.keys:
        reader.read(k)


def test_swapped_layer_folders_are_refused_by_readers_too(tmp_path: Path):
    """A unit's layer_0 and layer_1 folders swapped whole (a botched copy; no codec, so every size still matches):
    each array's metadata says which layer it holds, so a reader opening it refuses the unit instead of serving layer
    1's states as layer 0's."""
    import shutil

    path = tmp_path / "s.zarr"
    _, vid, samples, _ = store_with_unit(path, [40, 25, 60], seed=3, hidden=32, chunk=16, codec="none")
    unit = _unit_dir(path, vid)
    shutil.move(unit / "layer_0", unit / "swap")
    shutil.move(unit / "layer_1", unit / "layer_0")
    shutil.move(unit / "swap", unit / "layer_1")
    with pytest.raises(CorruptData, match="layer_0 holds layer 1"):
        HiddenStateDataset(path)[0]
    _assert_detected(path, vid, samples, "layer_0 holds layer 1")

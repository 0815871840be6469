"""Corruption suite: each kind of damage is named by verify (exit 1, sample named) and by reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hsstore import Store
from hsstore.core.errors import CorruptData
from hsstore.storage.verify import verify

from helpers import run_cli, store_with_unit


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
    """Array metadata has no chunk checksum of its own: the commit's crc32c of every file catches it."""
    path, vid, samples = store_path
    meta = _unit_dir(path, vid) / "layer_1" / "zarr.json"
    text = meta.read_text()
    meta.write_text(text.replace('"layer": 1', '"layer": 7'))  # same size, other bytes
    assert meta.stat().st_size == len(text)
    result = verify(Store.open(path))
    assert not result.ok and "layer_1/zarr.json has crc32c" in result.problems[0].what
    assert {p.key for p in result.problems} == {s.key for s in samples}

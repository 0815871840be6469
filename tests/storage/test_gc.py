"""gc: never follows a symlink, never leaves the store, never removes a unit a readable commit record
names, and says what it would remove with --dry-run. One definition of "committed" for every reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import crashed_unit, run_cli, store_with_unit

from hsstore import Store
from hsstore.core.errors import CorruptData
from hsstore.storage.verify import verify


def _store(tmp: Path) -> tuple[Path, str, list, dict]:
    """A store with one committed unit (writer ``w``) and one crashed writer's uncommitted unit."""
    path = tmp / "s.zarr"
    store, vid, samples, states = store_with_unit(path, [5, 9], seed=1)
    crashed_unit(store, vid, [4], seed=2)
    return path, vid, samples, states


def _precious(tmp: Path) -> Path:
    """A directory outside the store shaped like a store's insides (units with files in them)."""
    out = tmp / "elsewhere"
    (out / "units" / "precious").mkdir(parents=True)
    (out / "units" / "precious" / "data.bin").write_bytes(b"not the store's")
    (out / "precious").mkdir()
    (out / "precious" / "data.bin").write_bytes(b"not the store's either")
    return out


def _gc(path: Path, *extra: str) -> dict:
    r = run_cli("gc", str(path), "--force", "--json", *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("link", ["variant-dir", "units-dir", "unit-dir"])
def test_gc_never_follows_a_symlink_out_of_the_store(tmp_path: Path, link: str):
    path, vid, samples, states = _store(tmp_path)
    outside = _precious(tmp_path)
    if link == "variant-dir":  # a whole "variant" that is a link to elsewhere
        (path / "variants" / "0123456789ab").symlink_to(outside)
    elif link == "units-dir":  # a variant whose units/ is a link
        other = path / "variants" / "ba9876543210"
        other.mkdir()
        (other / "units").symlink_to(outside / "units")
    else:  # one "unit" that is a link
        (path / "variants" / vid / "units" / "evil").symlink_to(outside / "precious")
    r = _gc(path)
    assert (outside / "units" / "precious" / "data.bin").exists()
    assert (outside / "precious" / "data.bin").exists()
    assert r["removed_units"] == [f"{vid}/crashed-000000"]  # the real debris still goes
    reader = Store.open(path).reader(vid)
    assert torch.equal(reader.read(samples[1].key)["layers"][2], states[2][5:])


def test_gc_keeps_a_unit_whose_commit_record_was_renamed(tmp_path: Path):
    path, vid, samples, states = _store(tmp_path)
    commits = path / "variants" / vid / "commits"
    (commits / "w-000000.json").rename(commits / "renamed.json")
    r = _gc(path)
    assert f"{vid}/w-000000" not in r["removed_units"]
    assert (path / "variants" / vid / "units" / "w-000000" / "layer_2").is_dir()
    # the renamed record commits nothing: readers refuse the variant and name the record, verify reports it
    with pytest.raises(CorruptData, match="renamed.json names unit 'w-000000'"):
        Store.open(path).reader(vid).check_corrupt_commits()
    assert not verify(Store.open(path)).ok
    (commits / "renamed.json").rename(commits / "w-000000.json")  # put back: nothing was lost
    reader = Store.open(path).reader(vid)
    assert torch.equal(reader.read(samples[0].key)["layers"][1], states[1][:5])
    assert verify(Store.open(path)).ok


def test_a_record_copied_under_another_units_name_commits_nothing(tmp_path: Path):
    path, vid, samples, _ = _store(tmp_path)
    commits = path / "variants" / vid / "commits"
    # a copy named after the crashed unit would otherwise make its (unwritten) samples look committed
    (commits / "crashed-000000.json").write_bytes((commits / "w-000000.json").read_bytes())
    reader = Store.open(path).reader(vid)
    assert [c.unit for c in reader.commits] == ["w-000000"]
    assert "names unit 'w-000000'" in reader.bad_commits[0][1]
    r = _gc(path)
    assert r["removed_units"] == []  # both units are named by a readable record: both kept


def test_gc_dry_run_says_what_it_would_remove_and_removes_nothing(tmp_path: Path):
    path, vid, _, _ = _store(tmp_path)
    (path / "variants" / vid / "commits" / ".tmp-0123").write_bytes(b"half a record")
    before = sorted(str(p) for p in path.rglob("*"))
    r = _gc(path, "--dry-run")
    assert r["dry_run"] is True and r["removed_units"] == [f"{vid}/crashed-000000"] and r["removed_files"] > 5
    assert sorted(str(p) for p in path.rglob("*")) == before
    text = run_cli("gc", str(path), "--force", "--dry-run")
    assert text.returncode == 0 and "would remove 1 uncommitted unit" in text.stdout
    assert f"{vid}/crashed-000000" in text.stdout
    r = _gc(path)
    assert r["dry_run"] is False and r["removed_units"] == [f"{vid}/crashed-000000"]
    assert not (path / "variants" / vid / "units" / "crashed-000000").exists()
    assert not (path / "variants" / vid / "commits" / ".tmp-0123").exists()
    assert verify(Store.open(path)).ok


def test_gc_through_a_store_path_that_is_a_link_works(tmp_path: Path):
    """The store's own path may be a link the user made; only links inside the store are refused."""
    path, vid, _, _ = _store(tmp_path)
    link = tmp_path / "link.zarr"
    os.symlink(path, link)
    assert _gc(link)["removed_units"] == [f"{vid}/crashed-000000"]


def test_stores_do_not_nest_and_gc_never_removes_a_store_inside_another(tmp_path: Path):
    """A store cannot be created inside another (at any depth, e.g. in a variant's units/), and a store
    put there by hand is not a crashed writer's unit: gc, even forced, leaves it and says why."""
    from hsstore.core.errors import BadInput

    path, vid, _, _ = _store(tmp_path)
    units = path / "variants" / vid / "units"
    for inside in (units / "inner.zarr", path / "sub" / "deeper.zarr"):
        with pytest.raises(BadInput, match="is inside the hsstore store"):
            Store.create(inside)
        assert not inside.exists()
    r = run_cli("convert", str(path), "--precision", "fp8-e4m3", "--store", str(units / "inner.zarr"))
    assert r.returncode == 2 and "is inside the hsstore store" in r.stderr and len(r.stderr.splitlines()) == 1
    inner, inner_vid, _, _ = store_with_unit(tmp_path / "inner.zarr", [6], seed=5)
    os.rename(tmp_path / "inner.zarr", units / "inner")  # moved in by hand
    out = _gc(path)
    assert out["removed_units"] == [f"{vid}/crashed-000000"]
    assert [s["what"] for s in out["skipped"]] == [f"unit {vid}/inner"]
    assert len(Store.open(units / "inner").reader(inner_vid).keys) == 1

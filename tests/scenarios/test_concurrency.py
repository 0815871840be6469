"""Commands side by side (docs/concurrency.md): gc racing writers, in real processes. A unit's writer
holds its lease from the moment the unit's folder appears until its commit; gc removes only units
whose lease it takes itself; a commit never names a file that is not there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import racers
from helpers import store_with_unit

from hsstore import Store
from hsstore.core.errors import WriteFailed
from hsstore.storage import layout
from hsstore.storage.gc import collect_garbage
from hsstore.storage.verify import verify
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import make_samples, make_states


def assert_all_readable(path: Path, vid: str) -> int:
    """Every committed sample of ``vid`` reads (tokens and every layer) and verify is clean; returns how many."""
    reader = Store.open(path).reader(vid)
    for key in reader.keys:
        ref = reader.ref(key)
        reader.read_tokens(ref)
        reader.read_layers(ref, reader.record.all_layers)
    report = verify(Store.open(path))
    assert report.ok, report.problems[:5]
    return len(reader.keys)


@pytest.mark.process
@pytest.mark.parametrize("force,grace", [(True, 0.0), (False, 3600.0)], ids=["gc-force-grace-0", "plain-gc"])
def test_gc_racing_a_writer_never_removes_its_units(tmp_path: Path, force: bool, grace: float):
    """gc in a loop (``--force --grace 0``, or plain) while another process writes 12 units: the writer
    finishes, every unit it committed is whole, verify is clean."""
    path = tmp_path / "s.zarr"
    _, vid, _, _ = store_with_unit(path, [5], seed=1)
    gc = racers.start("gc", path, "force" if force else "plain", grace)
    writer = racers.start("writer", path, 12, 7)
    racers.wait([writer])
    (gc_rc, gc_err), (w_rc, w_err) = racers.stop_all(path, [gc, writer])
    assert w_rc == 0, w_err[-2000:]
    assert gc_rc == 0, gc_err[-2000:]
    assert assert_all_readable(path, vid) == 13


def test_gc_force_keeps_a_unit_whose_writer_holds_its_lease(tmp_path: Path):
    """A unit being written (its lease held) survives ``gc --force --grace 0``; once its writer has
    committed, the unit is whole."""
    path = tmp_path / "s.zarr"
    store, vid, _, _ = store_with_unit(path, [5], seed=1)
    lease = store.io.claim(
        layout.unit_key(vid, "busy-000000", layout.META), b'{"zarr_format": 3, "node_type": "group"}'
    )
    assert lease is not None
    try:
        out = collect_garbage(Store.open(path, mode="a"), grace_seconds=0, force=True)
        assert out.kept_in_progress == [f"{vid}/busy-000000"]
        assert (path / "variants" / vid / "units" / "busy-000000" / "zarr.json").exists()
    finally:
        lease.release()
    out = collect_garbage(Store.open(path, mode="a"), grace_seconds=0, force=True)
    assert out.removed_units == [f"{vid}/busy-000000"]  # released by a writer that never committed


def test_a_unit_folder_never_exists_without_its_writer_record(tmp_path: Path):
    """The claim makes the folder and its record in one rename: no moment when gc could take the folder
    for a crashed writer's debris."""
    path = tmp_path / "s.zarr"
    store, vid, _, _ = store_with_unit(path, [5], seed=1)
    lease = store.io.claim(layout.unit_key(vid, "u-000000", layout.META), b"{}")
    assert lease is not None
    assert store.io.claim(layout.unit_key(vid, "u-000000", layout.META), b"{}") is None  # taken
    lease.release()
    units = path / "variants" / vid / "units"
    assert sorted(p.name for p in units.iterdir()) == ["u-000000", "w-000000", "zarr.json"]  # no temporary left


def test_a_commit_never_names_a_file_that_is_gone(tmp_path: Path):
    """A file of the unit removed before its commit (here: by hand, between the writer's last write and
    its commit) fails the write with one line; nothing is committed."""
    path = tmp_path / "s.zarr"
    store, vid, _, _ = store_with_unit(path, [5], seed=1)
    rec = store.variant_record(vid)
    samples = make_samples([6], seed=3)
    w = UnitWriter(store, vid, writer_id="x")
    arrays = w._write_arrays

    def write_then_lose_one(uid, *args):  # noqa: ANN001, ANN202 - what a hand-run rm does meanwhile
        out = arrays(uid, *args)
        (path / "variants" / vid / "units" / uid / "layer_0" / "c" / "0" / "0").unlink()
        return out

    w._write_arrays = write_then_lose_one
    with pytest.raises(WriteFailed, match=r"file layer_0/c/0/0 is gone before its commit"):
        w.write(samples, make_states(samples, rec.hidden_size, rec.dtype, rec.all_layers))
    assert not (path / "variants" / vid / "commits" / "x-000000.json").exists()
    assert verify(Store.open(path)).ok


@pytest.mark.process
def test_two_imports_of_one_folder_at_once_account_for_every_sample(tmp_path: Path):
    """Two imports of one folder into one store, side by side, one sample per unit: each reports every
    sample as written by it or already there (a unit the other committed first is "already there", not
    lost from the count), and the store holds each sample once."""
    from interop_files import WRITERS, random_samples

    n = 16
    WRITERS["specforge"](tmp_path / "src", random_samples(n=n))
    path = tmp_path / "s.zarr"
    procs = [racers.start("import", path, "specforge", tmp_path / "src", "0,1,2,final_norm", "output") for _ in "ab"]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for r in reports:
        assert r["samples"] == n and r["samples_written"] + r["samples_present"] == n, reports
    assert sum(r["samples_written"] for r in reports) >= n  # (both may write one sample: readers show it once)
    [vid] = Store.open(path).variant_ids()
    assert assert_all_readable(path, vid) == n


def test_gc_sweeps_a_dead_claims_folder_and_only_that(tmp_path: Path):
    """A claim cut short (its temporary unit folder left, its lock gone) is swept by gc; one still held is
    kept; a folder named like a temporary one anywhere else is not gc's."""
    path = tmp_path / "s.zarr"
    _, vid, _, _ = store_with_unit(path, [5], seed=1)
    units = path / "variants" / vid / "units"
    dead, held = units / ".tmp-dead", units / ".tmp-held"
    for d in (dead, held):
        d.mkdir()
        (d / "zarr.json").write_bytes(b"{}")
    lease = Store.open(path).io.lease_if_free(f"variants/{vid}/units/.tmp-held")  # a live claimer's lock
    other = path / "variants" / vid / ".tmp-notes"
    other.mkdir()
    (other / "mine.txt").write_bytes(b"not gc's")
    try:
        collect_garbage(Store.open(path, mode="a"), grace_seconds=0, force=True)
        assert not dead.exists() and held.exists() and (other / "mine.txt").exists()
    finally:
        lease.release()

"""A variant's sample index (hsstore.storage.sample_table): the reader answers exactly what the rule says
(units by id, samples in record order, the first unit to hold a key wins), for duplicates across units and
odd keys alike, while holding no Python object per sample."""

from __future__ import annotations

import gc
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hsstore.core.schema.store_records import CommitRecord
from hsstore.read.streaming import StreamingHiddenStateDataset
from hsstore.storage.reader import SampleRef, commit_order
from hsstore.storage.sample_table import Keys, Refs, SampleTable, UnitRecords, unit_part
from hsstore.storage.stats import array_stats, health_problems, problems
from hsstore.storage.store import Store
from hsstore.storage.verify import verify
from hsstore.storage.writer import UnitWriter
from hsstore.testing.bench import write_tiny_store
from hsstore.testing.factories import make_samples, make_states, new_variant


def _rule(records: list[CommitRecord]) -> dict[str, SampleRef]:
    """The reader's rule, written the plain way: units in commit order, first unit to hold a key wins."""
    refs: dict[str, SampleRef] = {}
    by_unit = {c.unit: c for c in records}
    for c in (by_unit[u] for u in commit_order(by_unit)):
        for k, off, n in c.samples:
            refs.setdefault(k, SampleRef(k, c.unit, off, n))
    return refs


def _sizes(refs: dict[str, SampleRef]) -> list[int]:
    sizes: dict[str, int] = {}
    for r in refs.values():
        sizes[r.unit] = sizes.get(r.unit, 0) + 1
    return list(sizes.values())


def test_units_sharing_samples_read_as_the_first_unit_committed_wins(tmp_path: Path):
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    s = make_samples([3, 5, 2, 7, 4, 6], seed=1)
    written = {}
    for wid, part in (("c", [s[4], s[1]]), ("a", [s[0], s[1], s[2]]), ("b", [s[2], s[3], s[0], s[5]])):
        states = make_states(part, 16, "bf16", [0, 1, 2], seed=ord(wid))
        UnitWriter(store, vid, writer_id=wid).write(part, states, skip_committed=False)
        starts = [0]
        for x in part:
            starts.append(starts[-1] + x.length)
        written.update({(wid, x.key): states[2][starts[i] : starts[i + 1]] for i, x in enumerate(part)})
    reader = Store.open(tmp_path / "s.zarr").reader(vid)
    records = list(reader.commits)
    want = _rule(records)
    assert list(reader.keys) == list(want) and reader.keys == list(want) and len(reader.keys) == len(want)
    assert [reader.ref(i) for i in range(len(want))] == list(want.values())
    assert all(reader.refs[k] == want[k] and reader.ref(k) == want[k] and k in reader.refs for k in want)
    assert reader.unit_sizes() == _sizes(want) and reader.n_tokens == sum(r.length for r in want.values())
    for uid in reader.units:
        assert reader.unit_refs(uid) == [r for r in want.values() if r.unit == uid]
    for k, ref in want.items():  # the states read are the winning unit's
        assert torch.equal(reader.read(k, [2])["layers"][2], written[(ref.unit.split("-")[0], k)])
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", shuffle=False)
    assert ds.unit_sizes == _sizes(want) and len(ds) == len(want)
    assert [it["key"] for it in ds] == list(want)
    report = verify(store)
    assert report.ok and report.samples_checked == len(want)
    shared = sum(1 for k in want if sum(k == x for c in records for x, _, _ in c.samples) > 1)
    assert any(f"{shared} sample(s) committed by more than one unit" in n for n in report.notes)
    with pytest.raises(KeyError, match="not committed"):
        reader.ref("0" * 32)


def _odd_records(seed: int) -> list[CommitRecord]:
    """Commit records whose keys are anything a record may hold: hex keys, keys sharing long prefixes,
    of other lengths, non-ASCII, ending in NUL, and keys repeated within and across units."""
    rng = random.Random(seed)
    pool = [f"{rng.getrandbits(128):032x}" for _ in range(40)]
    pool += ["p" * 40 + str(i) for i in range(6)] + ["k", "kk", "ключ", "a\x00", "a", "\x00"]
    out = []
    for u in range(5):
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 14))]
        lens = [rng.randint(1, 9) for _ in keys]
        offs = [sum(lens[:i]) for i in range(len(keys))]
        out.append(
            CommitRecord(
                unit=f"w{rng.randint(0, 99):02d}-{u:06d}",
                samples=list(zip(keys, offs, lens)),
                layers=[0],
                files={"zarr.json": 10},
                stats={},
            )
        )
    return sorted(out, key=lambda c: c.unit)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_index_answers_as_the_rule_for_any_keys(seed: int, ascii_only: bool):
    records = [
        c for c in _odd_records(seed) if not ascii_only or all(k.isascii() and "\x00" not in k for k, _, _ in c.samples)
    ]
    want = _rule(records)
    table = SampleTable([unit_part(CommitRecord.from_dict(c.to_dict(), "test")) for c in records])
    keys, refs, units = Keys(table), Refs(table, "v"), UnitRecords(table)
    assert list(keys) == list(want) and keys[1:4] == list(want)[1:4] and list(refs) == list(want)
    assert [table.ref(i) for i in range(len(want))] == list(want.values())
    assert all(refs[k] == want[k] and k in refs and k in keys for k in want)
    for absent in ("zz", "p" * 41, "a\x00\x00", "ключи", "", "f" * 32):
        assert absent not in refs and absent not in keys
        with pytest.raises(KeyError):
            refs[absent]
    assert table.unit_sizes() == _sizes(want) and table.n_tokens() == sum(r.length for r in want.values())
    counts: dict[str, int] = {}
    for c in records:
        for k, _, _ in c.samples:
            counts[k] = counts.get(k, 0) + 1
    assert table.duplicated_keys == sum(1 for n in counts.values() if n > 1)
    assert [units[c.unit] for c in records] == records  # each unit's record comes back as it was read
    assert [table.unit_tokens(c.unit) for c in records] == [c.n_tokens for c in records]


def test_opening_a_variant_makes_no_python_object_per_sample(tmp_path: Path):
    n = 3000
    _, vid = write_tiny_store(tmp_path / "s.zarr", n, unit_samples=1000)
    store = Store.open(tmp_path / "s.zarr")
    store.variant_record(vid)
    gc.collect()
    before = len(gc.get_objects())
    reader = store.reader(vid)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert len(reader.keys) == n and grown < n // 10, grown  # a record or ref per sample would be >= n


def _arrays():
    rng = np.random.default_rng(0)
    yield rng.standard_normal((5, 8)).astype(np.float32)
    for v in (0.0, -0.0, 1.5, -3.0, np.nan, np.inf, -np.inf):
        for shape in ((1, 1), (1, 4), (3, 4), (0, 4)):
            yield np.full(shape, v, np.float32)
    mixed = np.zeros((2, 3), np.float32)
    mixed[0, 0] = -0.0
    yield mixed
    for v in (np.nan, np.inf, 2.0, 0.0):
        x = rng.standard_normal((4, 4)).astype(np.float32)
        x[1, 2] = v
        yield x
        yield np.where(x == v, v, 7.0).astype(np.float32)


def test_verify_judges_each_sample_as_the_full_statistics_would():
    for x in _arrays():
        assert health_problems(x) == problems(array_stats(x)), x


def test_verify_names_the_bad_samples_and_only_those(tmp_path: Path):
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    s = make_samples([3, 4, 2, 5], seed=3)
    states = make_states(s, 16, "bf16", [0, 1, 2])
    states[0][3:7] = 0  # sample 1, layer 0: all zero
    states[1][7:9] = 2.0  # sample 2, layer 1: constant
    states[2][9:14, 3] = float("nan")  # sample 3, layer 2: NaN
    UnitWriter(store, vid, check_health=False).write(s, states)
    found = sorted((p.key, p.what) for p in verify(Store.open(tmp_path / "s.zarr")).problems)
    assert found == sorted(
        [
            (s[1].key, "layer 0: all values are zero"),
            (s[2].key, "layer 1: all values are equal (constant layer)"),
            (s[3].key, "layer 2: 5 NaN and 0 Inf values"),
        ]
    )


def test_samples_committed_later_come_after_every_earlier_one_whatever_their_writer_ids(tmp_path: Path):
    """A map-style index is a place in commit order: a store that grows keeps every index it had (units by id put a
    later writer whose random id sorts first at index 0, and every sample an index-based hold-out, ``random_split``
    or a sampler's checkpoint had named moved)."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    seen: list[str] = []
    for seed, wid in enumerate(["f0", "a0", "c0", "00"]):  # each writer's id sorts before the last one's
        UnitWriter(store, vid, writer_id=wid).write(*_unit_of([5, 3, 4], seed))
        time.sleep(0.01)  # (commit times are kept to the millisecond)
        keys = list(Store.open(path).reader(vid).keys)
        assert keys[: len(seen)] == seen, wid  # nothing committed earlier moved
        seen = keys
    assert [Store.open(path).reader(vid).ref(i).unit for i in range(0, 12, 3)] == [
        "f0-000000",
        "a0-000000",
        "c0-000000",
        "00-000000",
    ]


def _unit_of(lengths: list[int], seed: int) -> tuple[list, dict]:
    samples = make_samples(lengths, seed=seed + 100)
    return samples, make_states(samples, 16, "bf16", [0, 1, 2], seed=seed)


def test_one_writers_units_keep_its_order_whenever_its_threads_commit_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A writer's threads commit its units out of turn (unit 1 a millisecond before unit 0): ordered by commit
    time alone, two builds of the same inputs, or a variant and its FP8 copy, put their samples at other indices.
    A writer's units come in the order it made them, after every writer that committed first."""
    from hsstore.storage import writer as writer_module

    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    w = UnitWriter(store, vid, writer_id="w0")
    made = []
    for seq, at in enumerate(["2026-01-01T00:00:02.000+00:00", "2026-01-01T00:00:01.000+00:00"]):
        monkeypatch.setattr(writer_module, "_now", lambda at=at: at)
        samples, states = _unit_of([4, 6], seq)
        w.write(samples, states)
        made += [s.key for s in samples]
    monkeypatch.setattr(writer_module, "_now", lambda: "2026-01-01T00:00:03.000+00:00")
    later, states = _unit_of([5], 9)
    UnitWriter(store, vid, writer_id="a0").write(later, states)
    assert list(Store.open(path).reader(vid).keys) == made + [later[0].key]

"""The streaming dataset over ranks: a rank and world size given or the process group's (also in a pickle
sent to the ranks), torchrun launches that read each key once per epoch and resume on another number of
ranks, ranks that open a growing store moments apart, and states ``load_state_dict`` refuses."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import REPO, make_samples, make_states, new_variant, shared_dir

from hsstore import HiddenStateDataset, Store
from hsstore.core.errors import BadInput
from hsstore.storage.writer import UnitWriter


def test_a_world_size_without_a_rank_is_refused_not_every_rank_reading_rank_0s_share(tmp_path: Path):
    """``world_size=2`` alone, outside a process group, read rank 0's share on every rank (half the data never
    trained; under torchrun the group's rank is taken now: tests/dist_stream_check.py passes world_size alone);
    a rank alone, or one past the world, failed only at the first iteration with an error naming workers."""
    from hsstore import StreamingHiddenStateDataset

    store = Store.create(tmp_path / "s.zarr")
    UnitWriter(store, new_variant(store)).write(
        make_samples([4, 5, 6]), make_states(make_samples([4, 5, 6]), 16, "bf16", [0, 1, 2])
    )
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", world_size=2)
    with pytest.raises(BadInput, match=r"world_size=2\) without rank= and no torch.distributed process group"):
        list(ds)
    with pytest.raises(BadInput, match=r"rank=1 is not one of world_size=1's ranks"):
        StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1, world_size=1)
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1)
    with pytest.raises(BadInput, match=r"rank=1\) without world_size="):
        list(ds)
    assert len(list(StreamingHiddenStateDataset(tmp_path / "s.zarr", rank=1, world_size=2))) in (1, 2)
    for bad in (
        {"world_size": 0, "rank": 0},
        {"world_size": 2, "rank": 0.5},
        {"world_size": 2, "rank": True},
        {"world_size": "2", "rank": 1},
    ):  # (world_size=0 read the whole store as world 1)
        with pytest.raises(BadInput, match="a whole number from"):
            StreamingHiddenStateDataset(tmp_path / "s.zarr", **bad)


def test_ranks_left_to_the_process_group_are_the_receiving_processes_and_a_world_past_it_is_refused(tmp_path: Path):
    """A dataset made before the process group and sent to the ranks (``mp.spawn(main, args=(ds,))``) froze
    world 1, rank 0 when pickled: every rank read the whole store. Unknown ranks now stay unknown in the pickle
    (a world_size alone, which could not be pickled, pickles); under a group they are the group's, and a
    world_size past the group's size (ranks whose shares no process reads) is refused."""
    import pickle

    from hsstore import StreamingHiddenStateDataset

    store = Store.create(tmp_path / "s.zarr")
    samples = make_samples([4, 5, 6, 7])
    UnitWriter(store, new_variant(store)).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))
    for kw in ({}, {"world_size": 2}):
        sent = pickle.loads(pickle.dumps(StreamingHiddenStateDataset(tmp_path / "s.zarr", **kw)))
        assert (sent._world, sent._rank) == (kw.get("world_size"), None)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ds = StreamingHiddenStateDataset(tmp_path / "s.zarr")
        assert (pickle.loads(pickle.dumps(ds))._world, pickle.loads(pickle.dumps(ds))._rank) == (1, 0)
        with pytest.raises(BadInput, match="world_size=2 but the process group has 1 ranks"):
            list(StreamingHiddenStateDataset(tmp_path / "s.zarr", world_size=2))
    finally:
        torch.distributed.destroy_process_group()


def _torchrun(nproc: int, store: Path, out: str, modes: str, context: str = "fork") -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(REPO / "tests" / "dist_stream_check.py"),
        str(store),
        out,
        modes,
        context,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _load(out: str, mode: str, n: int) -> list[dict]:
    return [json.loads(Path(f"{out}{mode}-{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="session")
def two_rank_streams(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One torchrun launch of two ranks (two DataLoader workers each) over the tiny store, shared by the
    tests below: full epochs, then a partial epoch with its state. What each rank saw is in
    ``{prefix}{mode}-{rank}.json``; the prefix is returned."""
    d = shared_dir(tmp_path_factory, "streams", lambda d: _torchrun(2, tiny_store, f"{d}/run-", "full,partial"))
    return f"{d}/run-"


@pytest.mark.process
def test_torchrun_two_ranks_two_workers_each_key_once_per_epoch(tiny_store: Path, two_rank_streams: str):
    ranks = _load(two_rank_streams, "full", 2)
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    assert len(all_keys) == 40
    for epoch in ("epoch0", "epoch1"):
        seen = [k for r in ranks for k in r[epoch]]
        assert len(seen) == len(all_keys) and set(seen) == all_keys
    assert [r["epoch0"] for r in ranks] == [r["epoch0_again"] for r in ranks]
    assert [r["epoch0"] for r in ranks] != [r["epoch1"] for r in ranks]


@pytest.mark.process
def test_torchrun_resume_mid_epoch_with_another_world_size(tiny_store: Path, two_rank_streams: str, tmp_path: Path):
    first = _load(two_rank_streams, "partial", 2)
    state = first[0]["state"]
    assert state == first[1]["state"]  # gathered over ranks
    out = str(tmp_path / "run-")
    Path(f"{out}state.json").write_text(json.dumps(state))
    _torchrun(1, tiny_store, out, "resume")
    before = [k for r in first for k in r["seen"]]
    after = _load(out, "resume", 1)[0]["seen"]
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    assert before and after
    assert not set(before) & set(after)
    assert len(before) + len(after) == len(all_keys) and set(before) | set(after) == all_keys


@pytest.mark.process
def test_torchrun_persistent_spawned_workers_keep_their_rank_and_resume_on_three_ranks(
    tiny_store: Path, tmp_path: Path
):
    """Spawned workers have no process group: each keeps its rank's share (not the whole store), follows
    set_epoch across epochs as persistent workers, and a state from 2 ranks resumes on 3: each key once."""
    out = str(tmp_path / "spawn-")
    _torchrun(2, tiny_store, out, "full,partial", "spawn")
    ranks = _load(out, "full", 2)
    all_keys = set(HiddenStateDataset(tiny_store, variant="dtype=bf16").keys)
    for epoch in ("epoch0", "epoch0_again", "epoch1"):
        seen = [k for r in ranks for k in r[epoch]]
        assert len(seen) == len(all_keys) and set(seen) == all_keys
    assert [r["epoch0"] for r in ranks] == [r["epoch0_again"] for r in ranks] != [r["epoch1"] for r in ranks]
    first = _load(out, "partial", 2)
    Path(f"{out}state.json").write_text(json.dumps(first[0]["state"]))
    _torchrun(3, tiny_store, out, "resume")
    before = [k for r in first for k in r["seen"]]
    after = [k for r in _load(out, "resume", 3) for k in r["seen"]]
    assert before and after and len(before) + len(after) == len(all_keys) and set(before) | set(after) == all_keys


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"epoch": 0},
        [],
        {"epoch": "0", "seed": 0, "n": 3, "variant": "v", "consumed": ""},
        "bad-hex",
        "bytes-after-the-marks",
        "format-1",
    ],
)
def test_load_state_dict_refuses_what_state_dict_never_returns(state, tmp_path: Path):
    from hsstore import StreamingHiddenStateDataset
    from hsstore.core.errors import BadInput
    from hsstore.testing.factories import store_with_unit

    store_with_unit(tmp_path / "s.zarr", [3, 4, 5])
    ds = StreamingHiddenStateDataset(tmp_path / "s.zarr")
    good = ds.state_dict()
    if state == "bad-hex":
        state = {**good, "consumed": "zz"}
    elif state == "bytes-after-the-marks":  # a zlib stream that ends, then garbage: not what state_dict writes
        import base64

        state = {**good, "consumed": base64.b64encode(base64.b64decode(good["consumed"]) + b"junk").decode()}
    elif state == "format-1":
        state = {**good, "format": 1}
    with pytest.raises(BadInput, match="state"):
        ds.load_state_dict(state)
    ds.load_state_dict(good)  # what state_dict returns still loads


@contextlib.contextmanager
def _ranks(script: str, path: Path, d: Path) -> Iterator[list[subprocess.Popen]]:
    """Two ranks running ``script`` (gloo, a file rendezvous in ``d``); each must exit 0, and none outlives the test."""
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(path), str(d), str(r)], cwd=REPO, stderr=subprocess.PIPE)
        for r in (0, 1)
    ]
    try:
        yield procs
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stderr.read().decode()[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wait_for(flag: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)


_SKEWED_RANK = """
import json, os, sys, time
from pathlib import Path
import torch.distributed as dist
from hsstore import StreamingHiddenStateDataset
path, d, rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{d / 'rendezvous'}", rank=rank, world_size=2)
if rank == 0:
    (d / "r0-opens").write_text("")
else:  # this rank opens the store after it grew
    while not (d / "grown").exists():
        time.sleep(0.02)
ds = StreamingHiddenStateDataset(path, seed=3)
ds.set_epoch(0)
keys = []
for it in ds:
    keys.append(it["key"])
    ds.mark_consumed(it)
state = ds.state_dict()  # gathers every rank's marks
(d / f"r{rank}.json").write_text(json.dumps({"keys": keys, "n": ds.n, "consumed": int(ds.consumed.sum())}))
dist.destroy_process_group()
"""


@pytest.mark.process
def test_ranks_that_open_a_growing_store_moments_apart_read_rank_0s_snapshot(tmp_path: Path):
    """torchrun ranks start seconds apart while a build commits: each rank cut its share from its own snapshot (15
    samples on one, 30 on the other: samples trained twice or never, without a word), then the marks' gather failed
    on their sizes and aborted a rank. Every rank reads the units rank 0 opened: each of its samples once."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    first = make_samples([5, 6, 7, 8, 9, 10], seed=1)
    UnitWriter(store, vid).write(first, make_states(first, 16, "bf16", [0, 1, 2]))
    with _ranks(_SKEWED_RANK, path, tmp_path) as procs:
        _wait_for(tmp_path / "r0-opens", procs)
        time.sleep(1.0)  # rank 0 has opened the store (and waits for rank 1 to open it)
        later = make_samples([11, 12, 13, 14], seed=2)
        UnitWriter(store, vid).write(later, make_states(later, 16, "bf16", [0, 1, 2]))
        (tmp_path / "grown").write_text("")
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    # rank 0's snapshot (the first unit, unless a loaded machine let rank 0 open the store after it grew), once
    snap = first if got[0]["n"] == len(first) else first + later
    keys = got[0]["keys"] + got[1]["keys"]
    assert sorted(keys) == sorted(s.key for s in snap)
    assert [g["n"] for g in got] == [len(snap)] * 2 and sum(g["consumed"] for g in got) == len(snap)


_PRE_INIT_RANK = """
import json, sys, time
from pathlib import Path
import torch.distributed as dist
from hsstore import StreamingHiddenStateDataset
from hsstore.core.errors import BadInput
path, d, rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if rank == 1:  # this rank opens the store after it grew, both before the process group
    while not (d / "grown").exists():
        time.sleep(0.02)
ds = StreamingHiddenStateDataset(path, seed=3)
(d / f"r{rank}-opened").write_text("")
dist.init_process_group("gloo", init_method=f"file://{d / 'rendezvous'}", rank=rank, world_size=2)
if rank == 0:  # a dataset of this rank alone (rank= and world_size= given): not collective, no hang
    alone = len(list(StreamingHiddenStateDataset(path, rank=0, world_size=1)))
dist.barrier()
try:
    ds.state_dict()
    said = None
except BadInput as e:
    said = str(e)
(d / f"r{rank}.json").write_text(json.dumps({"said": said, "alone": alone if rank == 0 else None}))
dist.destroy_process_group()
"""


@pytest.mark.process
def test_ranks_whose_datasets_were_made_before_the_process_group_on_other_snapshots_are_told_at_the_gather(
    tmp_path: Path,
):
    """Datasets made before init_process_group cannot agree on a snapshot: the marks' gather aborted a rank in gloo
    (sizes differ); it is one BadInput on every rank naming the fix. A dataset given rank= and world_size= is one
    rank's own: made on rank 0 alone it neither waits for the others nor hangs."""
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vid = new_variant(store)
    first = make_samples([5, 6, 7, 8], seed=1)
    UnitWriter(store, vid).write(first, make_states(first, 16, "bf16", [0, 1, 2]))
    with _ranks(_PRE_INIT_RANK, path, tmp_path) as procs:
        _wait_for(tmp_path / "r0-opened", procs)
        later = make_samples([9, 10], seed=2)
        UnitWriter(store, vid).write(later, make_states(later, 16, "bf16", [0, 1, 2]))
        (tmp_path / "grown").write_text("")
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    assert all("different snapshots of the store (4 to 6 samples)" in g["said"] for g in got), got
    assert got[0]["alone"] == len(first) + len(later)  # made after the store grew

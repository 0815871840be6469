"""Crash, concurrency and distributed-build suites: real processes, real SIGKILLs, real files (builds that are
not killed, raced or distributed run in this process)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    DATA,
    REPO,
    assert_bit_exact,
    build_racing,
    diff_report,
    kill_build,
    run_cli,
    start_build,
    write_manifest,
)

from hsstore import Store
from hsstore.storage.verify import verify

LIMIT = "48"


def _manifest(tmp: Path, name: str, files: list[str] | None = None) -> Path:
    # many small units, so kills land in forward passes, unit writes and commits alike
    return write_manifest(
        tmp / f"{name}.toml",
        store=str(tmp / f"{name}.zarr"),
        model="builtin:tiny-llama",
        layers="{ aux = [0, 1], target = [3] }",
        files=files,
        extra_build="",
        dtypes='["bf16"]',
    )


def _small_units(path: Path) -> Path:
    path.write_text(
        path.read_text()
        .replace("unit_tokens = 2048", "unit_tokens = 600")
        .replace("token_budget = 2048", "token_budget = 600")
    )
    return path


def _start_build(manifest: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return start_build(manifest, "--limit", LIMIT, *extra, env=env)


def _bit_exact_and_complete(store: Path, reference: Path, n: int) -> None:
    (v,) = Store.open(store).variants
    assert v.n_samples == n
    reader = Store.open(store).reader(v.id)
    assert len(reader.keys) == len(set(reader.keys)) == n
    result = verify(Store.open(store))
    assert result.ok, result.problems
    try:
        assert_bit_exact(str(store), str(reference), n)
    except AssertionError as e:  # name who wrote the samples that differ, and which side a third build agrees with
        raise AssertionError(f"{_writers_of_differing(store, reference)}\n{_arbiter(store, reference)}\n{e}") from None


def _arbiter(store: Path, reference: Path) -> str:
    """Which of ``store`` and ``reference`` a third one-process build, in a fresh process, agrees with on every
    sample: where two builds differ, this says which one computed differently."""
    tmp = store.parent / "arbiter"
    tmp.mkdir(exist_ok=True)  # a test that checks twice builds it once
    r = run_cli("build", str(_small_units(_manifest(tmp, "third"))), "--limit", LIMIT, "--quiet", process=True)
    if r.returncode != 0:
        return f"a third build, to say which side is off, failed: {r.stderr[-500:]}"
    sides = (("the reference", reference), ("the store under test", store))
    agree = [name for name, side in sides if _same_bits(tmp / "third.zarr", side)]
    return f"a third build in a fresh process agrees bit for bit with: {' and '.join(agree) or 'neither'}"


def _same_bits(a: Path, b: Path) -> bool:
    return all(L["bit_exact"] == 1.0 and L["rel_l2"] == 0.0 for L in diff_report(str(a), str(b))["layers"])


def _writers_of_differing(store: Path, reference: Path) -> str:
    """Each sample whose states differ from the reference's, with the writer (pid, this process or not), unit and
    commit time of every commit record holding it."""
    rep = diff_report(str(store), str(reference))
    held: dict[str, list[str]] = {}
    for c in sorted(store.glob("variants/*/commits/*.json")):
        rec = json.loads(c.read_text())
        w = rec["writer"]
        who = f"pid {w['pid']}{' (this test process)' if w['pid'] == os.getpid() else ''}"
        for key, _, _ in rec["samples"]:
            held.setdefault(key, []).append(f"{who}, unit {rec['unit']} at {rec['committed_at']}")
    bad = [s for s in rep["worst_samples"] if s["rel_l2"] > 0]
    return "samples that differ (worst first): " + "; ".join(
        f"{s['key']} rel_l2 {s['rel_l2']:.2e} written by {held.get(s['key'])}" for s in bad
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ref")
    m = _small_units(_manifest(tmp, "ref"))
    # a fresh process, as every build compared with it: an inline build here would run in a test process that has
    # run hundreds of other tests (a two-node build once differed from it in one batch, and nothing says which
    # side was off: see _arbiter)
    r = run_cli("build", str(m), "--limit", LIMIT, "--quiet", process=True)
    assert r.returncode == 0, r.stderr
    return tmp / "ref.zarr"


def _committed_keys(store: Path) -> set[str]:
    """The sample keys committed in ``store`` so far, read from its commit records (each is renamed into
    place whole, so a record seen is a record committed)."""
    return {s[0] for c in store.glob("variants/*/commits/*.json") for s in json.loads(c.read_text())["samples"]}


def _when(condition: Callable[[], bool], p: subprocess.Popen) -> None:
    """Poll (every 5 ms) until ``condition()`` holds or the build ``p`` has ended."""
    deadline = time.monotonic() + 300
    while not condition() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def _starts(store: Path) -> int:
    """How many builds have opened ``store`` (each writes its start record then)."""
    return len(list(store.glob("builds/*/r0-start.json")))


def _kill_moments(store: Path, units: int, rng: random.Random) -> list[tuple[str, Callable[[int], bool], float]]:
    """Seeded moments spread over a whole build, each found in the store's files rather than guessed from a
    clock (the tiny model computes its units in a fraction of a second, so clock times land mostly in
    start-up): (what, condition of the number of start records before the attempt, seeded delay after the
    condition holds). ``units``: how many units the uninterrupted build committed."""
    early, late = rng.randint(1, units // 3), rng.randint(units // 2, units - 2)
    commits = lambda: len(list(store.glob("variants/*/commits/*.json")))  # noqa: E731
    return [
        ("start-up (imports, tokenizing)", lambda started: True, rng.uniform(0.2, 1.5)),
        ("model loading", lambda started: _starts(store) > started, rng.uniform(0.0, 1.0)),
        (f"a unit after commit {early}", lambda started: commits() >= early, rng.uniform(0.0, 0.05)),
        (f"a unit after commit {late}", lambda started: commits() >= late, rng.uniform(0.0, 0.05)),
        (
            "completion (every sample committed)",
            lambda started: len(_committed_keys(store)) == int(LIMIT),
            rng.uniform(0.0, 0.3),
        ),
    ]


@pytest.mark.process
def test_sigkill_at_seeded_moments_then_resume(reference: Path, tmp_path: Path, monkeypatch):
    """SIGKILLs (driver and worker at once) at five seeded moments over a build's whole course: start-up,
    model loading, mid-unit and at commits early and late in the build, and while it completes. No kill
    loses a sample committed before it or leaves a store verify would flag; the resumed build is complete
    and bit-identical to an uninterrupted one, and removes the temporary folders the killed builds left."""
    m = _small_units(_manifest(tmp_path, "crash"))
    store = tmp_path / "crash.zarr"
    temp = tmp_path / "tmp"
    temp.mkdir()
    units = len(list(reference.glob("variants/*/commits/*.json")))
    assert units >= 6, f"the reference build committed only {units} units: too few to kill mid-way"
    committed_after_kill = {}
    left: set[Path] = set()
    for what, condition, delay in _kill_moments(store, units, random.Random(1234)):
        started = _starts(store)
        p = _start_build(m, env={"TMPDIR": str(temp)})
        _when(lambda: condition(started), p)
        time.sleep(delay)
        seen = _committed_keys(store)
        running = p.poll() is None
        kill_build(p)  # the driver and its worker, mid-whatever
        left |= set(temp.glob("hsstore-build-*"))  # nobody removed these: the next build must
        assert running or what.startswith("completion"), f"the build ended before the kill during {what}"
        if (store / "zarr.json").exists():
            assert seen <= _committed_keys(store), f"the kill during {what} lost committed samples"
            s = Store.open(store)
            committed_after_kill[what] = sum(v.n_samples for v in s.variants)
            # committed data is intact after every kill (a cut-short put's temporary file is debris: a note)
            result = verify(s)
            assert result.ok, result.problems
    counts = list(committed_after_kill.values())
    assert len(counts) >= 4 and counts == sorted(counts)
    assert all(0 < n < int(LIMIT) for w, n in committed_after_kill.items() if w.startswith("a unit"))
    assert left, "no kill left a driver's temporary folder behind: the sweep proves nothing"
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the resume (in this process) makes its folder there
    r = run_cli("build", str(m), "--limit", LIMIT, "--quiet")  # the resume (the kills were the processes')
    assert r.returncode == 0, r.stderr
    _bit_exact_and_complete(store, reference, int(LIMIT))
    assert not list(temp.glob("hsstore-build-*")), "the builds after the kills left the killed ones' folders"
    gc = run_cli("gc", str(store), "--json")
    assert gc.returncode == 0
    _bit_exact_and_complete(store, reference, int(LIMIT))  # still, after gc


@pytest.mark.process
def test_four_concurrent_builds_of_one_manifest(reference, tmp_path: Path):
    """Four writers of one manifest at once: three build processes and this one, which joins them once
    they have committed a unit."""
    ref_store = reference
    m = _small_units(_manifest(tmp_path, "conc"))
    store = tmp_path / "conc.zarr"
    procs = [_start_build(m) for _ in range(3)]
    here = build_racing(procs, lambda: bool(_committed_keys(store)), str(m), "--limit", LIMIT, "--quiet")
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0, 0] and here.returncode == 0, [p.stderr.read().decode()[-500:] for p in procs] + [here.stderr]
    _bit_exact_and_complete(store, ref_store, int(LIMIT))


@pytest.mark.process
def test_concurrent_builds_of_overlapping_inputs(tmp_path: Path):
    rows = DATA.read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(rows[0:30]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(rows[15:45]) + "\n")
    ma = _small_units(_manifest(tmp_path, "a", files=[str(tmp_path / "a.jsonl")]))  # many commits: still running
    mb = _small_units(_manifest(tmp_path, "b", files=[str(tmp_path / "b.jsonl")]))
    store = tmp_path / "shared.zarr"
    # a build process of one, and this process building the other once the first has committed a unit
    p = _start_build(ma, "--store", str(store))
    here = build_racing(
        [p], lambda: bool(_committed_keys(store)), str(mb), "--store", str(store), "--limit", LIMIT, "--quiet"
    )
    assert p.wait(timeout=300) == 0 and here.returncode == 0, (p.stderr.read().decode()[-2000:], here.stderr)
    (v,) = Store.open(store).variants
    assert v.n_samples == 45
    assert verify(Store.open(store)).ok


@pytest.mark.process
def test_torchrun_two_rank_build_is_bit_exact_to_one_process(reference, tmp_path: Path):
    ref_store = reference
    m = _small_units(_manifest(tmp_path, "dist"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hsstore",
        "build",
        str(m),
        "--limit",
        LIMIT,
        "--quiet",
        "--json",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    _bit_exact_and_complete(tmp_path / "dist.zarr", ref_store, int(LIMIT))
    (vid,) = Store.open(tmp_path / "dist.zarr").variant_ids()
    builds = list((tmp_path / "dist.zarr" / "variants" / vid / "builds").glob("*.json"))
    assert len(builds) == 1 and json.loads(builds[0].read_text())["complete"] is True
    (lineage,) = (tmp_path / "dist.zarr" / "builds").iterdir()  # one build id, agreed by both ranks
    assert sorted(p.name for p in lineage.iterdir()) == [
        "r0-end.json",
        "r0-start.json",
        "r1-end.json",
        "r1-start.json",
        "rows.jsonl",
    ]
    writers = {c.writer.writer.split("-")[0] for c in Store.open(tmp_path / "dist.zarr").reader(vid).commits}
    assert writers == {"r0", "r1"}  # both ranks wrote units


@pytest.mark.process
def test_two_node_torchrun_build_is_bit_exact_to_one_process(reference, tmp_path: Path):
    """Two torchrun launchers (node ranks 0 and 1, one process each, rendezvous on loopback): both
    processes have LOCAL_RANK 0 and distinct RANKs, as on two real nodes sharing one store."""
    import socket

    ref_store = reference
    m = _small_units(_manifest(tmp_path, "nodes"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logs = [tmp_path / f"node{node}.log" for node in (0, 1)]  # files, not pipes: a full pipe would stall a node
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "hsstore",
                "build",
                str(m),
                "--limit",
                LIMIT,
                "--quiet",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=logs[node].open("w"),
        )
        for node in (0, 1)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    _bit_exact_and_complete(tmp_path / "nodes.zarr", ref_store, int(LIMIT))
    (vid,) = Store.open(tmp_path / "nodes.zarr").variant_ids()
    writers = {c.writer.writer.split("-")[0] for c in Store.open(tmp_path / "nodes.zarr").reader(vid).commits}
    assert writers == {"r0", "r1"}  # the global rank names the writer, not the local one


@pytest.mark.process  # its reference fixture is built by a process
def test_write_error_stops_build_and_keeps_committed_data(reference, tmp_path: Path):
    """A store that starts failing mid-build (files made unwritable: a full disk's stand-in)."""
    ref_store = reference
    m = _small_units(_manifest(tmp_path, "full"))
    shutil.copytree(ref_store, tmp_path / "full.zarr")  # LIMIT samples committed by a finished build
    before = Store.open(tmp_path / "full.zarr").variants[0].n_samples
    units = next((tmp_path / "full.zarr" / "variants").glob("*/units"))
    blocker = units.parent / "units-blocked"
    units.rename(blocker)
    units.write_text("not a directory")  # every new unit now fails to be created
    r = run_cli("build", str(m), "--limit", str(int(LIMIT) + 8), "--quiet")  # 8 more samples: new units
    assert r.returncode == 1 and "error:" in r.stderr
    units.unlink()
    blocker.rename(units)
    s = Store.open(tmp_path / "full.zarr")
    assert s.variants[0].n_samples == before and verify(s).ok


@pytest.mark.process
def test_a_build_overtaken_by_a_concurrent_build_reports_the_truth(tmp_path: Path):
    """Build B commits a unit and is frozen; build A fills the variant; B resumes and finds every sample it
    computes committed already. B's counts must add up: written + present + committed by another writer."""
    import os
    import signal

    from helpers import children

    m = write_manifest(tmp_path / "m.toml", layers="{ aux = [0, 1], target = [3] }")
    m.write_text(
        m.read_text()
        .replace("unit_tokens = 2048", "unit_tokens = 256")
        .replace("token_budget = 2048", "token_budget = 256")
    )
    cmd = [sys.executable, "-m", "hsstore", "build", str(m), "--limit", "40", "--quiet", "--json"]
    b = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = tmp_path / "store.zarr"
    deadline = time.time() + 120
    while time.time() < deadline and b.poll() is None and not list(store.glob("variants/*/commits/*.json")):
        time.sleep(0.005)
    group = [b.pid, *children(b.pid)]
    for pid in group:
        os.kill(pid, signal.SIGSTOP)
    try:
        n_before = sum(len(json.loads(c.read_text())["samples"]) for c in store.glob("variants/*/commits/*.json"))
        assert b.poll() is None and 0 < n_before < 40, "build B was not stopped mid-way"
        a = run_cli("build", str(m), "--limit", "40", "--quiet", "--json")
        assert a.returncode == 0, a.stderr[-2000:]
    finally:
        for pid in reversed(group):
            os.kill(pid, signal.SIGCONT)
    out, err = b.communicate(timeout=300)
    assert b.returncode == 0, err[-2000:]
    (va,) = json.loads(a.stdout)["variants"]
    (vb,) = json.loads(out)["variants"]
    total = va["samples_written"] + va["samples_present"]
    assert total == Store.open(store).variants[0].n_samples
    assert vb["samples_by_others"] > 0 and vb["samples_written"] >= n_before
    assert vb["samples_written"] + vb["samples_present"] + vb["samples_by_others"] == total

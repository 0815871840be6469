"""Stopping a build: SIGTERM/SIGINT/SIGHUP to the driver stop its worker; a worker outlives no driver.

Real processes throughout: the driver is ``python -m hsstore build`` (or torchrun's ranks), its worker
is found under it in /proc, and every check waits for a state (a commit, a worker's variant file), not
for a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, alive, children, kill_build, run_cli, wait_for, write_manifest

from hsstore import Store
from hsstore.core.schema.build import BuildRecord
from hsstore.storage.verify import verify

pytestmark = pytest.mark.process  # see docs/testing.md

LIMIT = 60


def _manifest(tmp: Path) -> Path:
    """A model wide enough (hidden 512) and units small enough (600 tokens) that a build of LIMIT samples
    commits many units over several seconds: a signal always lands mid-build."""
    m = write_manifest(
        tmp / "m.toml",
        model="builtin:tiny-llama",
        layers="{ aux = [1], target = [2] }",
        store=str(tmp / "s.zarr"),
        dtypes='["fp32"]',
        extra_model="config = { hidden_size = 512, intermediate_size = 2048 }",
    )
    m.write_text(
        m.read_text()
        .replace("unit_tokens = 2048", "unit_tokens = 600")
        .replace("token_budget = 2048", "token_budget = 600")
    )
    return m


def _start(cmd: list[str], tmp: Path) -> subprocess.Popen:
    (tmp / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp / "tmp")}  # the driver's temporary folder lands here
    # its own process group in this session, as a shell runs a job (a new session's group would be
    # orphaned, and the kernel ignores Ctrl-Z's SIGTSTP for orphaned groups)
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0
    )


def _build(tmp: Path, *extra: str) -> subprocess.Popen:
    return _start(
        [sys.executable, "-m", "hsstore", "build", str(_manifest(tmp)), "--limit", str(LIMIT), "--quiet", *extra], tmp
    )


def _temp_folders(tmp: Path) -> list[Path]:
    return list((tmp / "tmp").glob("hsstore-build-*"))


def _computing(driver: int, store: Path, rank: int = 0) -> int | None:
    """The driver's worker, once it has committed a unit (so it is mid-build)."""
    workers = children(driver)
    return workers[0] if workers and any(store.glob(f"variants/*/commits/r{rank}-*.json")) else None


@contextlib.contextmanager
def _reaped(p: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """The build ``p``, killed outright (its whole process group) on the way out if it is still running."""
    try:
        yield p
    finally:
        if p.poll() is None:
            kill_build(p)


def _stop(p: subprocess.Popen, sig: int) -> str:
    """Send the build's driver ``sig``; its stderr, once it has ended with exit code 128 + ``sig``."""
    os.kill(p.pid, sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    return err


def test_sigterm_stops_the_worker_cleans_up_and_a_rerun_resumes(tmp_path: Path):
    with _reaped(_build(tmp_path)) as p:
        worker = wait_for(lambda: _computing(p.pid, tmp_path / "s.zarr") or p.poll() is not None, what="a first commit")
        assert p.poll() is None, "the build ended before it could be stopped"
        err = _stop(p, signal.SIGTERM)
    (line,) = err.strip().splitlines()  # one line: what was committed and how to resume
    assert line.startswith("error: interrupted by SIGTERM; the worker was stopped. variant ")
    assert "samples committed" in line and "re-run the same command to resume" in line
    assert not alive(worker) and not _temp_folders(tmp_path)
    store = Store.open(tmp_path / "s.zarr")
    assert 0 < store.variants[0].n_samples < LIMIT and verify(store).ok
    (end,) = (
        BuildRecord.from_json(f.read_bytes(), "record") for f in (tmp_path / "s.zarr").glob("builds/*/r0-end.json")
    )
    assert end.outcome == "interrupted" and f"error: {end.error}" == line  # the lineage says how it ended
    assert end.committed == {store.variants[0].id: store.variants[0].n_samples}
    r = run_cli("build", str(tmp_path / "m.toml"), "--limit", str(LIMIT), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    (res,) = json.loads(r.stdout)["variants"]
    assert res["samples_present"] > 0 and res["samples_present"] + res["samples_written"] == LIMIT
    assert json.loads(r.stdout)["complete"] == {res["variant"]: True}
    assert verify(Store.open(tmp_path / "s.zarr")).ok


def _stopped_by(sig: int, err: str, worker: int, tmp: Path) -> None:
    """The build ended on ``sig`` saying so, with its worker and its temporary folder gone."""
    assert f"interrupted by {signal.Signals(sig).name}" in err and "re-run the same command" in err
    assert not alive(worker) and not _temp_folders(tmp)


def test_sighup_stops_the_build_too(tmp_path: Path):
    with _reaped(_build(tmp_path)) as p:
        worker = wait_for(lambda: _computing(p.pid, tmp_path / "s.zarr"), what="a first commit")
        err = _stop(p, signal.SIGHUP)
    _stopped_by(signal.SIGHUP, err, worker, tmp_path)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_ctrl_z_suspends_the_worker_with_the_driver_and_continuing_resumes_both_then_ctrl_c_stops_them(tmp_path: Path):
    with _reaped(_build(tmp_path)) as p:
        worker = wait_for(lambda: _computing(p.pid, tmp_path / "s.zarr"), what="a first commit")
        os.kill(p.pid, signal.SIGTSTP)  # what Ctrl-Z sends the foreground job
        wait_for(lambda: _state(p.pid) == "T" and _state(worker) == "T", what="driver and worker stopped")
        os.kill(p.pid, signal.SIGCONT)  # fg / bg
        wait_for(lambda: _state(worker) != "T", what="the worker to continue")
        err = _stop(p, signal.SIGINT)  # Ctrl-C: the continued build stops as any does
    _stopped_by(signal.SIGINT, err, worker, tmp_path)


def test_a_worker_whose_driver_is_sigkilled_exits_by_itself(tmp_path: Path):
    p = _build(tmp_path)
    try:
        worker = wait_for(lambda: _computing(p.pid, tmp_path / "s.zarr"), what="a first commit")
        os.kill(p.pid, signal.SIGKILL)  # the driver only: nothing can run in it any more
        p.wait(timeout=60)
        wait_for(lambda: not alive(worker), 60, "the orphaned worker to exit")
        wait_for(lambda: not _temp_folders(tmp_path), 60, "the orphaned worker to remove the driver's folder")
    finally:
        kill_build(p)
    assert verify(Store.open(tmp_path / "s.zarr")).ok
    (record,) = (tmp_path / "s.zarr").glob("builds/*/r*.json")  # killed outright: its start record stands alone
    assert record.name == "r0-start.json" and json.loads(record.read_text())["outcome"] == "running"


def _rank_drivers(pid: int) -> dict[int, int] | None:
    """{rank: pid} of torchrun ``pid``'s two children, once both carry RANK in their environment."""
    found = {}
    for child in children(pid):
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            return None  # gone meanwhile
        for rank in (0, 1):
            if f"RANK={rank}".encode() in env:
                found[rank] = child
    return found if len(found) == 2 else None


def test_sigterm_to_one_torchrun_rank_stops_every_rank_and_worker(tmp_path: Path):
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
        str(_manifest(tmp_path)),
        "--limit",
        str(LIMIT),
        "--quiet",
    ]
    with _reaped(_start(cmd, tmp_path)) as p:
        # a child is a rank driver once it has exec'd with its RANK (between fork and exec it shows
        # torchrun's own environment: on a loaded machine that window is long enough to be seen)
        by_rank = wait_for(lambda: _rank_drivers(p.pid), what="two rank drivers")
        rank0, rank1 = by_rank[0], by_rank[1]
        ranks = [rank0, rank1]
        workers = [
            wait_for(lambda: _computing(r, tmp_path / "s.zarr", rank), what=f"rank {rank}'s first commit")
            for rank, r in ((0, rank0), (1, rank1))
        ]
        os.kill(rank1, signal.SIGTERM)  # as torchrun, a scheduler or an operator would
        _, err = p.communicate(timeout=180)
    assert p.returncode != 0
    assert err.count("interrupted by SIGTERM") == 2, err  # each rank: the operator's, then torchrun's
    assert not any(alive(pid) for pid in [*ranks, *workers]) and not _temp_folders(tmp_path)
    assert verify(Store.open(tmp_path / "s.zarr")).ok


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_any_command_stopped_by_a_signal_says_so_in_one_line(sig: int) -> None:
    """Not only build/convert/export/import: a report blocked on a full pipe (``hsstore info --json | slow``)
    stopped by a signal unwinds (its temporary files go) and says so in one line, exit 128 + the signal's
    number; before, SIGTERM and SIGHUP killed it outright and Ctrl-C exited 130 without a word."""
    import fcntl

    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.write(w, b"x" * fcntl.fcntl(w, fcntl.F_GETPIPE_SZ))  # full: the report's first write blocks
    p = subprocess.Popen(
        [sys.executable, "-m", "hsstore", "info", str(REPO / "tests" / "data" / "format-v1.zarr"), "--json"],
        cwd=REPO,
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(w)
    try:
        wait_for(
            lambda: "pipe_write" in Path(f"/proc/{p.pid}/wchan").read_text(),
            timeout=60,
            what="info blocked writing its report",
        )
        p.send_signal(sig)
        err = p.communicate(timeout=60)[1]
    finally:
        os.close(r)
    assert p.returncode == 128 + sig, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: info stopped by {signal.Signals(sig).name}"), err


# --- A driver folder whose owner was killed outright is removed by the next build; nothing else is


def _folder(tmp: Path, name: str, owner: object | None) -> Path:
    d = tmp / f"hsstore-build-{name}"
    d.mkdir()
    (d / "samples.npz").write_bytes(b"x")
    if owner is not None:
        (d / "owner.json").write_text(owner if isinstance(owner, str) else json.dumps(owner))
    return d


def test_only_folders_whose_owner_is_certainly_gone_are_swept(tmp_path: Path):
    from hsstore.capture.run.signals import process_id, sweep_stale_temps

    ended = subprocess.Popen(["true"])
    ended.wait()
    me = process_id(os.getpid())
    assert me["started"] is not None and me["boot"] and me["pidns"]  # (Linux: every field is known)
    gone = {
        "dead": {**me, "pid": ended.pid},
        "reused": {**me, "started": me["started"] - 1},  # this pid, but a process that started earlier
    }
    kept = {
        "alive": me,
        "other-host": {**me, "host": me["host"] + "-elsewhere", "pid": ended.pid},
        "other-container": {**me, "pidns": me["pidns"] + 1, "pid": ended.pid},
        "other-boot": {**me, "boot": "another-boot"},  # rebooted, or another sandbox's boot: cannot tell
        "other-boot-and-pidns": {**me, "boot": "another-boot", "pidns": me["pidns"] + 1},
        "unreadable": "{not json",
        "not-a-record": [ended.pid],
        "no-owner": None,  # being made, or made before owners were recorded
    }
    folders = {name: _folder(tmp_path, name, owner) for name, owner in {**gone, **kept}.items()}
    (tmp_path / "elsewhere").mkdir()
    target = _folder(tmp_path / "elsewhere", "target", gone["dead"])
    (tmp_path / "hsstore-build-link").symlink_to(target)  # a link to a stale folder: not followed, not removed
    (tmp_path / "hsstore-build-file").write_text("x")
    other = _folder(tmp_path, "x", None).rename(tmp_path / "another-tool-dead")  # not a driver folder
    (other / "owner.json").write_text(json.dumps(gone["dead"]))

    removed = sweep_stale_temps(tmp_path)
    assert sorted(removed) == sorted(str(folders[n]) for n in gone)
    assert not any(folders[n].exists() for n in gone)
    assert all((folders[n] / "samples.npz").exists() for n in kept)
    assert target.exists() and (tmp_path / "hsstore-build-link").is_symlink() and other.exists()
    assert (tmp_path / "hsstore-build-file").exists()


def test_a_build_names_itself_owner_of_its_folder_and_removes_stale_ones(tmp_path: Path, monkeypatch):
    import tempfile

    from hsstore.capture.run.signals import owned_temp, owner_gone, process_id

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with owned_temp() as tmp:
        owner = json.loads((Path(tmp) / "owner.json").read_text())
        assert owner == process_id(os.getpid()) and not owner_gone(owner)
    assert not Path(tmp).exists()
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale = _folder(tmp_path, "stale", {**process_id(os.getpid()), "pid": ended.pid})
    m = write_manifest(tmp_path / "m.toml", store=str(tmp_path / "s.zarr"))
    r = run_cli("build", str(m), "--limit", "2")  # in this process, whose temporary folder is tmp_path
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and f"temporary folder(s) of builds killed outright: {stale}" in r.stderr
    assert not list(tmp_path.glob("hsstore-build-*"))

"""Short writes and I/O errors: a build that cannot write stops non-zero with one line, commits nothing
partial, writes no "build complete" record, and the next build resumes cleanly.

A real build subprocess under a file-size limit (``RLIMIT_FSIZE``, SIGXFSZ ignored so writes fail with
EFBIG instead of killing the process), and a build in this process on a real full filesystem (a small tmpfs
mounted for the test); each resumed in this process once the fault is gone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import xxhash
from helpers import REPO, make_samples, make_states, new_variant, run_cli, write_manifest

from hsstore import Store
from hsstore.core.errors import WriteFailed
from hsstore.storage import fileio
from hsstore.storage.verify import verify
from hsstore.storage.writer import UnitWriter

LIMIT = "40"


def _manifest(tmp: Path, store: Path, unit_tokens: int = 2048) -> Path:
    m = write_manifest(tmp / "m.toml", store=str(store), layers="{ aux = [0, 1], target = [3] }")
    m.write_text(
        m.read_text()
        .replace("unit_tokens = 2048", f"unit_tokens = {unit_tokens}")
        .replace("token_budget = 2048", f"token_budget = {min(unit_tokens, 2048)}")
    )
    return m


def _build(manifest: Path, preexec: Callable[[], None] | None = None, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsstore", "build", str(manifest), "--limit", LIMIT, "--quiet", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
    )


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _assert_failed_cleanly(r: subprocess.CompletedProcess, store: Path, reason: str) -> int:
    """The build failed with one line naming ``reason``; what it committed is intact. Returns that count."""
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and reason in errors[0], r.stderr[-2000:]
    assert "re-run" in errors[0]
    result = verify(Store.open(store))
    assert result.ok, result.problems[:3]
    assert not list(store.glob("variants/*/builds/*.json"))  # no "build complete" record
    return result.samples_checked


def _assert_resumed(manifest: Path, store: Path) -> None:
    """The same command, run again once the fault is gone, completes the store (in this process: the fault,
    not the resume, needs a process of its own)."""
    r = run_cli("build", str(manifest), "--limit", LIMIT, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    result = verify(Store.open(store))
    assert result.ok and result.samples_checked == int(LIMIT), result.problems[:3]
    assert [v.n_samples for v in Store.open(store).variants] == [int(LIMIT)]
    assert len(list(store.glob("variants/*/builds/*.json"))) == 1


@pytest.mark.process
def test_file_size_limit_stops_the_build_and_it_resumes(tmp_path: Path):
    store = tmp_path / "s.zarr"
    m = _manifest(tmp_path, store)
    # the driver's sample file, token arrays and metadata fit under 96 KiB; a unit's layer shard
    # (2048 tokens x 64 x bf16, ~180 KB compressed) does not
    r = _build(m, _file_size_limit(96 << 10), "--no-space-check")  # (the space check refuses it up front: test_plan)
    assert _assert_failed_cleanly(r, store, "File too large") == 0
    assert "raise the file-size limit (ulimit -f" in r.stderr.lower() and "free space" not in r.stderr.lower(), r.stderr
    _assert_resumed(m, store)


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 768 KiB tmpfs: room for the first units of the build, not for all of them."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=768k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_filesystem_stops_the_build_and_it_resumes(tmp_path: Path, small_fs: Path):
    store = small_fs / "s.zarr"
    m = _manifest(tmp_path, store, unit_tokens=600)  # small units: some commit before the disk fills
    # the space check would refuse this build up front (test_plan proves that); here the disk fills mid-build.
    # In this process: a full disk fails every writer alike (the file-size limit above is a process's own)
    r = run_cli("build", str(m), "--limit", LIMIT, "--quiet", "--no-space-check")
    assert _assert_failed_cleanly(r, store, "No space left on device") > 0  # the first units fit
    assert "free space" in r.stderr.lower() and "file-size limit" not in r.stderr, r.stderr  # the fix for its cause
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)  # space freed
    _assert_resumed(m, store)


def test_a_read_only_filesystem_is_named_a_permission_fault_not_a_full_disk(tmp_path: Path, small_fs: Path):
    """A store whose filesystem turned read-only (EROFS) advised "Free space (or raise the file-size limit)":
    the advice names the cause and its fix (permissions, another --store)."""
    store = Store.create(small_fs / "s.zarr")
    vid = new_variant(store, hidden=32, chunk=16)
    samples = make_samples([40, 25], seed=3)
    writer = UnitWriter(store, vid, writer_id="w")
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        with pytest.raises(WriteFailed) as e:
            writer.write(samples, make_states(samples, 32, "bf16", [0, 1, 2]))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    msg = str(e.value)
    assert "Read-only file system" in msg and "not writable" in msg and "re-run" in msg, msg
    assert "free space" not in msg.lower() and "file-size limit" not in msg, msg


# ---- in-process: the checked write path itself ------------------------------------------------------


def _unit(tmp: Path) -> tuple[Store, str, list, dict]:
    store = Store.create(tmp / "s.zarr")
    vid = new_variant(store, hidden=32, chunk=16)
    samples = make_samples([40, 25, 60], seed=3)
    return store, vid, samples, make_states(samples, 32, "bf16", [0, 1, 2])


def test_short_writes_are_completed_and_every_file_is_checksummed(tmp_path: Path, monkeypatch):
    real = os.writev
    calls = []

    def short(fd: int, bufs: list) -> int:  # at most 100 bytes per call, as a signal or a quota may cause
        calls.append(1)
        first = memoryview(bufs[0]).cast("B")[:100]
        return real(fd, [first])

    monkeypatch.setattr(fileio.os, "writev", short)
    store, vid, samples, states = _unit(tmp_path)
    commit = UnitWriter(store, vid).write(samples, states)
    monkeypatch.undo()
    assert len(calls) > 50
    unit = tmp_path / "s.zarr" / "variants" / vid / "units" / commit.unit
    on_disk = {str(f.relative_to(unit)): f for f in unit.rglob("*") if f.is_file()}
    assert set(commit.files) == set(commit.checksums) == set(on_disk) and commit.checksum_kind == "xxh3"
    for rel, f in on_disk.items():
        data = f.read_bytes()
        assert commit.files[rel] == len(data) and commit.checksums[rel] == xxhash.xxh3_64_hexdigest(data), rel
    r = Store.open(tmp_path / "s.zarr").reader(vid)
    assert torch.equal(r.read(samples[2].key)["layers"][1], states[1][65:])
    assert verify(Store.open(tmp_path / "s.zarr")).ok


@pytest.mark.parametrize("fault", ["writev", "fsync", "close"])
def test_an_io_error_mid_unit_commits_nothing_and_the_next_write_works(tmp_path: Path, monkeypatch, fault: str):
    store, vid, samples, states = _unit(tmp_path)
    real = getattr(os, fault)
    n = {"calls": 0}

    def failing(fd: int, *args):
        try:  # count only files of this store open for writing (os is shared with every library here)
            ours = (
                os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
                and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
            )
        except OSError:
            ours = False
        n["calls"] += ours
        if ours and n["calls"] == 4:  # a few files in: the unit is half written
            if fault == "close":
                real(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, *args)

    monkeypatch.setattr(fileio.os, fault, failing)
    with pytest.raises(WriteFailed) as e:
        UnitWriter(store, vid, writer_id="w").write(samples, states)
    monkeypatch.undo()
    msg = str(e.value)
    assert "\n" not in msg and "Input/output error" in msg and "not committed" in msg and "re-run" in msg
    path = tmp_path / "s.zarr"
    assert Store.open(path).variants == []
    assert not list((path / "variants" / vid / "units").glob("w-*"))  # its partial files are removed
    UnitWriter(store, vid).write(samples, states)
    assert Store.open(path).variants[0].n_samples == 3 and verify(Store.open(path)).ok

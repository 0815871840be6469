"""convert under faults: a damaged source leaves no empty variant (or store) behind, a convert that
stopped after committing units resumes, and a write fault names the command that resumes it."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, one_sample_units, run_cli, wait_for

from hsstore import Store
from hsstore.storage.verify import verify


def _source(tmp: Path, n: int = 6) -> Path:
    """A bf16 store of ``n`` one-sample units."""
    one_sample_units(tmp / "src.zarr", [64 + 5 * i for i in range(n)], seed=1, hidden=256, chunk=64)
    return tmp / "src.zarr"


def _damage(src: Path, unit_index: int | None = None) -> None:
    """Flip a byte in every layer shard of the ``unit_index``-th unit (in unit-id order; None: of all)."""
    units = sorted(src.glob("variants/*/units/*/"))
    for f in (f for u in (units if unit_index is None else [units[unit_index]]) for f in u.glob("layer_*/c/**/*")):
        if f.is_file():
            b = bytearray(f.read_bytes())
            b[len(b) // 2] ^= 0xFF
            f.write_bytes(bytes(b))


def _convert(src: Path, *extra: str, preexec=None) -> subprocess.CompletedProcess:  # noqa: ANN001
    """``hsstore convert SRC --precision fp8-e4m3 --quiet EXTRA``: in this process (run_cli), or in a real
    process started with ``preexec`` (a limit of the process's own)."""
    argv = ["convert", str(src), "--precision", "fp8-e4m3", "--quiet", *extra]
    if preexec is None:
        return run_cli(*argv)
    return subprocess.run(
        [sys.executable, "-m", "hsstore", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
    )


def test_a_damaged_source_leaves_no_empty_variant_and_no_new_store(tmp_path: Path) -> None:
    src = _source(tmp_path)
    _damage(src)  # every unit: not one converts
    before = sorted(p.name for p in (src / "variants").iterdir())
    r = _convert(src, "--workers", "1")  # into the source's own store
    assert r.returncode == 1 and "crc32c" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in (src / "variants").iterdir()) == before  # no derived variant directory
    dst = tmp_path / "dst.zarr"
    r = _convert(src, "--workers", "1", "--store", str(dst))
    assert r.returncode == 1 and "crc32c" in r.stderr, r.stderr
    assert not dst.exists()  # the store it would have made is not left behind


def test_a_convert_stopped_after_committing_units_keeps_them_and_resumes(tmp_path: Path) -> None:
    src = _source(tmp_path)
    _damage(src, 3)  # unit 3 fails, the others convert
    dst = tmp_path / "dst.zarr"
    r = _convert(src, "--workers", "1", "--store", str(dst))
    assert r.returncode == 1 and "crc32c" in r.stderr, r.stderr
    [v] = Store.open(dst).variants
    assert v.n_samples == 5 and verify(Store.open(dst)).ok  # what it committed is there and sound
    fixed = _source(tmp_path / "again")  # the same samples, undamaged
    r = _convert(fixed, "--store", str(dst), "--json")
    assert r.returncode == 0, r.stderr
    assert '"samples_present": 5' in r.stdout and '"samples_converted": 1' in r.stdout
    assert [x.n_samples for x in Store.open(dst).variants] == [6]


@pytest.mark.process  # a file-size limit of the convert's own (docs/testing.md)
def test_a_write_fault_in_convert_names_convert_as_what_resumes(tmp_path: Path) -> None:
    src = _source(tmp_path)

    def limit() -> None:  # writes past 8 KiB fail with EFBIG (SIGXFSZ ignored) instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 10, 8 << 10))

    r = _convert(src, "--workers", "1", "--store", str(tmp_path / "dst.zarr"), preexec=limit)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "File too large" in errors[0], r.stderr
    assert "`hsstore convert` resumes" in errors[0] and "build" not in errors[0]


def test_a_failing_convert_never_removes_what_another_command_wrote(tmp_path: Path) -> None:
    """Two converts into one new --store: the one that fails (a damaged source) removes the store only if
    it made it, holds no variant and no other command has it open. Here the other convert finishes its
    variant while the failing one runs (its progress callback), and a third command holds the store."""
    from hsstore.core.errors import CorruptData
    from hsstore.storage.convert import convert

    good, bad = _source(tmp_path / "good", 2), _source(tmp_path / "bad", 2)
    _damage(bad)
    dst = tmp_path / "dst.zarr"
    ran: list = []

    def other_finishes(done: int, total: int) -> None:
        if not ran:
            ran.append(convert(str(good), "fp8-e4m3", str(dst), workers=1))

    with pytest.raises(CorruptData, match="crc32c"):
        convert(str(bad), "fp8-e4m3", str(dst), workers=1, on_progress=other_finishes)
    assert ran and ran[0].complete
    [v] = Store.open(dst).variants
    assert v.id == ran[0].variant and v.n_samples == 2 and verify(Store.open(dst)).ok

    held = tmp_path / "held.zarr"
    holders: list[Store] = []
    with pytest.raises(CorruptData, match="crc32c"):  # another command has the new store open, no variant yet
        convert(
            str(bad),
            "fp8-e4m3",
            str(held),
            workers=1,
            on_progress=lambda d, t: holders.append(Store.create(held)) if not holders else None,
        )
    assert Store.open(held).variants == []  # still there for the command that holds it
    holders.clear()
    with pytest.raises(CorruptData, match="crc32c"):  # alone, a failing convert leaves no store behind
        convert(str(bad), "fp8-e4m3", str(tmp_path / "alone.zarr"), workers=1)
    assert not (tmp_path / "alone.zarr").exists()


def _commits(store: Path) -> int:
    return sum(1 for _ in store.glob("variants/*/commits/*.json"))


@pytest.mark.process  # SIGINT to a real convert (docs/testing.md)
def test_ctrl_c_stops_convert_promptly_and_the_same_command_resumes(tmp_path: Path) -> None:
    """SIGINT mid-convert: queued units are not started, exit 130 with one line saying what is kept; the
    same command run again finishes (into the source's own store, which then holds two variants: the
    half-made one is no source, so the command needs no selector it did not need before)."""
    n = 20
    one_sample_units(tmp_path / "src.zarr", [48 + i % 7 for i in range(n)], seed=2, hidden=256, chunk=64)
    src = out = tmp_path / "src.zarr"
    before = _commits(src)
    cmd = [sys.executable, "-m", "hsstore", "convert", str(src), "--precision", "fp8-e4m3", "--quiet", "--workers", "1"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: out.exists() and _commits(out) > before, timeout=120, what="a converted unit")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "convert interrupted by SIGINT" in lines[0] and "re-run the same command" in lines[0], (
        err
    )
    assert _commits(out) - before < n  # stopped: not every queued unit ran
    assert verify(Store.open(out)).ok
    r = run_cli(*cmd[3:], "--json")  # the same command, in this process: the resume needs no process
    assert r.returncode == 0, r.stderr
    assert '"complete": true' in r.stdout

"""The one atomic replace (storage.fileio.replace_file) that store puts, exported caches and ``--json``
reports share: a file holds its old bytes or all its new ones, and no temporary file is left — checked in
real subprocesses under a file-size limit (``RLIMIT_FSIZE``, SIGXFSZ ignored: writes fail with EFBIG)."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, new_variant, run_cli, write_unit

from hsstore import Store
from hsstore.storage.fileio import replace_file

pytestmark = pytest.mark.process  # see docs/testing.md

OLD = b'{"old": true}'


def _limited(limit: int):  # noqa: ANN202
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_replace_that_cannot_finish_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_bytes(OLD)
    code = (
        "import sys; from hsstore.storage.fileio import replace_file\n"
        "try:\n    replace_file(sys.argv[1], b'x' * 8192, '.out.json.tmp')\n"
        "except OSError as e:\n    print(e.strerror)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limited(4096),
        check=True,
    )
    assert r.stdout.strip() == "File too large", r.stdout + r.stderr
    assert target.read_bytes() == OLD and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    replace_file(target, b"new", ".out.json.tmp")  # without the limit: the new bytes, still one file
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_diff_report_that_cannot_be_written_is_one_line_exit_1_and_the_old_report_stays(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "v.zarr")
    for dtype in ("bf16", "fp32"):
        write_unit(store, new_variant(store, dtype=dtype), [4])
    out = tmp_path / "reports"
    out.mkdir()
    (out / "r.json").write_bytes(OLD)
    s = str(tmp_path / "v.zarr")
    argv = ["diff", f"{s}#dtype=bf16", f"{s}#dtype=fp32", "--json", str(out / "r.json")]
    r = subprocess.run(
        [sys.executable, "-m", "hsstore", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(64),
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1, r.stderr[-2000:]
    assert "writing --json" in errors[0] and "File too large" in errors[0] and "Traceback" not in r.stderr
    assert (out / "r.json").read_bytes() == OLD and [p.name for p in out.iterdir()] == ["r.json"]
    r = run_cli(*argv)  # without the limit (in this process): the report replaces the old one
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "r.json").read_text())["layers"] and [p.name for p in out.iterdir()] == ["r.json"]

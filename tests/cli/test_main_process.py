"""Every command once as a real ``python -m hsstore`` process: its exit code and what it printed are those the
in-process runner (tests/inline_cli.py, which the rest of the suite calls through helpers.run_cli) reports
for the same call, on a failure (exit 2 with one ``error:`` line) and on a success (exit 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli

# command -> its arguments that are bad input ({tmp}: a fresh folder, {store}: the session's tiny store)
BAD = {
    "build": ["{tmp}/missing.toml"],
    "plan": ["{tmp}/missing.toml"],
    "env": ["--backend", "nope"],
    "diff": ["{tmp}/none.zarr", "{tmp}/none.zarr"],
    "check": ["builtin:tiny-qwen3_5", "{tmp}/none.zarr"],
    "convert": ["{tmp}/none.zarr", "--precision", "fp8-e4m3"],
    "import": ["specforge", "{tmp}/no-cache", "--store", "{tmp}/s.zarr"],
    "export": ["{tmp}/none.zarr", "specforge", "{tmp}/out"],
    "vocab-map": ["{store}", "--size", "32"],
    "info": ["{tmp}/none.zarr"],
    "verify": ["{tmp}/none.zarr"],
    "gc": ["{tmp}/none.zarr"],
    "label": ["{store}", "not a label"],
}
# command -> arguments that succeed and print the same text every time
GOOD = {
    "info": ["{store}"],
    "verify": ["{store}"],
    "gc": ["{store}", "--dry-run"],
}  # (diff's and build's reports carry their run time; their real processes succeed in test_replace_file and
#    test_reliability)


def _argv(args: list[str], tmp: Path, store: Path) -> list[str]:
    return [a.format(tmp=tmp, store=store) for a in args]


def _same(argv: list[str]) -> subprocess.CompletedProcess:
    """The subprocess's answer, checked to be the in-process runner's."""
    real = run_cli(*argv, process=True)
    inline = run_cli(*argv)
    assert (inline.returncode, inline.stdout, inline.stderr) == (real.returncode, real.stdout, real.stderr)
    return real


def test_every_command_has_its_real_process_case() -> None:
    import typer

    from hsstore.cli.main import app

    assert set(BAD) == set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.process  # see docs/testing.md
@pytest.mark.parametrize("command", sorted(BAD))
def test_a_real_process_exits_and_prints_as_the_inline_runner_reports(
    command: str, tiny_store: Path, tmp_path: Path
) -> None:
    r = _same([command, *_argv(BAD[command], tmp_path, tiny_store)])
    assert r.returncode == 2 and r.stdout.strip() == "", r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


@pytest.mark.process
@pytest.mark.parametrize("command", sorted(GOOD))
def test_a_real_process_succeeds_as_the_inline_runner_reports(command: str, tiny_store: Path, tmp_path: Path) -> None:
    r = _same([command, *_argv(GOOD[command], tmp_path, tiny_store)])
    assert r.returncode == 0 and r.stdout, r.stderr


def _ended(tmp: Path, setup: str, argv: list[str]) -> subprocess.CompletedProcess:
    """A real process that runs ``setup`` then the console script's ``run`` with ``argv``."""
    code = f"import atexit, sys, threading, time\n{setup}\nsys.argv = ['hsstore', *{argv!r}]\nfrom hsstore.cli.main import run\nrun()\n"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.process
def test_the_console_script_ends_without_teardown_but_as_an_exit_would(tmp_path: Path) -> None:
    """``run`` ends the process with os._exit (torch's and transformers' teardown cost ~1 CPU-second a process):
    what an exit does that matters still happens: exit handlers run, buffered output is flushed whole, a
    non-daemon thread still working is waited for, and the exit status is main's."""
    done, handler = tmp_path / "thread-done", tmp_path / "handler-ran"
    r = _ended(
        tmp_path,
        f"atexit.register(lambda: open({str(handler)!r}, 'w').write('x'))\n"
        f"threading.Thread(target=lambda: (time.sleep(0.5), open({str(done)!r}, 'w').write('x'))).start()\n"
        "sys.stdout.write('y' * 100000)",
        ["--help"],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("y" * 100000) and "Usage" in r.stdout  # buffered text first, all of it, then help
    assert done.exists() and handler.exists()
    r = _ended(tmp_path, "", ["info", str(tmp_path / "none.zarr")])
    assert r.returncode == 2 and r.stderr.startswith("error: ")
    closed = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m hsstore --help >/dev/null 2>&-"],
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert closed.returncode == 0  # stderr closed at start (sys.stderr None): nothing to flush, not a failure

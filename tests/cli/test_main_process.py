"""Every command once as a real ``python -m hsstore`` process: its exit code and what it printed are those the
in-process runner (tests/inline_cli.py, which the rest of the suite calls through helpers.run_cli) reports
for the same call, on a failure (exit 2 with one ``error:`` line) and on a success (exit 0)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import run_cli

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
def test_a_real_process_exits_and_prints_as_the_inline_runner_reports(command: str, tiny_store: Path,
                                                                        tmp_path: Path) -> None:
    r = _same([command, *_argv(BAD[command], tmp_path, tiny_store)])
    assert r.returncode == 2 and r.stdout.strip() == "", r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


@pytest.mark.process
@pytest.mark.parametrize("command", sorted(GOOD))
def test_a_real_process_succeeds_as_the_inline_runner_reports(command: str, tiny_store: Path, tmp_path: Path) -> None:
    r = _same([command, *_argv(GOOD[command], tmp_path, tiny_store)])
    assert r.returncode == 0 and r.stdout, r.stderr

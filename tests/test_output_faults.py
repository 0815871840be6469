"""Reports on stdout that cannot be written whole — a file-size limit, a full disk — fail in one line with
exit 1; never a traceback, never exit 0 with the JSON cut off (docs/errors.md, `output-incomplete`)."""

from __future__ import annotations

import ast
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_cli

STORE = REPO / "tests" / "data" / "format-v1.zarr"
COMMANDS = {
    "info": ["info", str(STORE), "--json"],
    "verify": ["verify", str(STORE), "--json"],
    "diff": ["diff", f"{STORE}#3cd1", f"{STORE}#b4b2", "--json", "-"],
}


def _run(args: list[str], stdout: object, limit: int | None = None) -> subprocess.CompletedProcess:
    def lower() -> None:  # as `ulimit -f`: the shell leaves SIGXFSZ at its default, which kills the writer
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "hsstore", *args], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=300, preexec_fn=lower if limit is not None else None)


@pytest.mark.process
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_a_file_size_limit_on_stdout_is_exit_1_not_a_cut_report(cmd: str, tmp_path: Path) -> None:
    whole = run_cli(*COMMANDS[cmd])  # the whole report (in this process: only the limited run needs its own)
    assert whole.returncode == 0, whole.stderr
    json.loads(whole.stdout)
    limit = len(whole.stdout.encode()) // 2  # half the report fits
    with open(tmp_path / "out.json", "w") as f:
        r = _run(COMMANDS[cmd], f, limit)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1, r.stderr
    assert len(errors) == 1 and errors[0].startswith("error: writing the report to stdout failed"), r.stderr
    assert "File too large" in errors[0] and "Traceback" not in r.stderr


@pytest.mark.process
def test_a_full_disk_on_stdout_is_one_line_exit_1() -> None:
    with open("/dev/full", "w") as f:
        r = _run(COMMANDS["info"], f)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "No space left on device" in r.stderr and "Traceback" not in r.stderr


def test_every_command_prints_its_report_through_write_stdout() -> None:
    """One place writes reports (hsstore.cli.output): no typer.echo or print to stdout elsewhere."""
    offenders = []
    for path in sorted((REPO / "hsstore" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("echo", "print"):
                if not any(k.arg in ("err", "file") for k in node.keywords):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders

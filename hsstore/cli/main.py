"""The ``hsstore`` entry point: registers every command module and turns errors into exit codes."""

from __future__ import annotations

import os
import signal
import sys
from typing import Protocol, TypeGuard

import typer

from hsstore.cli import build_cmd, compare_cmd, interop_cmd, plan_cmd, store_cmd  # noqa: F401  (each registers its commands)  # noqa: F401
from hsstore.cli.app import app, state
from hsstore.core.errors import HsstoreError, escape_controls
from hsstore.core.interrupt import Stopped, end_process, exit_code, stop_on_signals


def _whole_summaries() -> None:
    """Each command's line in ``hsstore --help`` is the first paragraph of its docstring, whole (click would
    cut it at ~45 characters with "...")."""
    for cmd in app.registered_commands:
        doc = cmd.help or (cmd.callback.__doc__ if cmd.callback else None) or ""
        if cmd.short_help is None and doc:
            cmd.short_help = " ".join(doc.strip().split("\n\n")[0].split())


_whole_summaries()


class _UsageError(Protocol):
    """What main needs of click's (typer-vendored) usage error, told apart by its attributes."""

    exit_code: int

    def format_message(self) -> str: ...


class _ShowableError(Protocol):
    """What main needs of any other click exception: it prints itself and carries an exit code."""

    exit_code: int

    def show(self) -> None: ...


def _is_usage_error(e: Exception) -> TypeGuard[_UsageError]:
    return callable(getattr(e, "format_message", None)) and getattr(e, "exit_code", None) == 2


def _is_showable(e: Exception) -> TypeGuard[_ShowableError]:
    return callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int)


def run() -> None:
    """The ``hsstore`` console script and ``python -m hsstore``: ``main``, then the process ends without the
    interpreter's teardown (``hsstore.core.interrupt.end_process``)."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    end_process(code)


def main() -> None:
    """Entry point: errors become one line on stderr and an exit code (2 bad input, 1 failed check)."""
    if hasattr(signal, "SIGXFSZ"):  # past a file-size limit a write fails (EFBIG, one line), never kills us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        with stop_on_signals():  # every command: a stop signal unwinds it (its temporary files go), one line
            rc = app(standalone_mode=False)  # click returns typer.Exit's code here instead of raising
        sys.exit(rc if isinstance(rc, int) else 0)
    except Stopped as e:
        cmd = next((a for a in sys.argv[1:] if not a.startswith("-")), "hsstore")
        typer.echo(
            f"error: {cmd} stopped by {e} before it finished; nothing it was "
            "writing is left half-written (re-run it to finish)",
            err=True,
        )
        sys.exit(128 + e.signum)
    except HsstoreError as e:
        if state["debug"] or os.environ.get("HSSTORE_DEBUG"):
            raise
        typer.echo(f"error: {e.one_line()}", err=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as e:  # click (as vendored by typer) usage errors carry their own exit code
        if _is_usage_error(e):
            ctx = getattr(e, "ctx", None)  # one line, as every other error: what is wrong and where help is
            sub = f" {ctx.info_name}" if ctx is not None and ctx.parent is not None else ""
            where = f" (see hsstore{sub} --help)"
            typer.echo(f"error: {escape_controls(e.format_message())}{where}", err=True)
            sys.exit(2)
        if _is_showable(e):
            e.show()
            sys.exit(e.exit_code)
        raise

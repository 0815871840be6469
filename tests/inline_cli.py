"""``hsstore ARGS`` run in this process through the real entry point, answered like a subprocess.

``run_inline`` calls ``hsstore.cli.main.main`` with ``sys.argv`` set, builds running their workers inline
(``hsstore.capture.run.driver.inline_workers``), and returns a ``CompletedProcess``: the exit code ``main``
exits with, and what the command wrote to stdout and stderr (as text, newlines as a subprocess's text
mode reads them). Everything it changes for the call is put back after it: the working directory,
``os.environ``, ``sys.argv``, the CLI's ``--debug`` state, signal handlers, the warning filters, and
where logging handlers that write to stderr/stdout write.

What it cannot reproduce: a process's start (``PYTHON*`` variables, import-time settings, the kernel
packages this process blocked or loaded: see hsstore.capture.model.kernels.bind_backend) and a process's end
(signals, exit codes of a killed process). Tests about those run the real command in a subprocess.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout


class _Stream(io.TextIOWrapper):
    """A text stream over bytes (``.buffer`` works, as on a real stdout); not a terminal."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        return raw.replace("\r\n", "\n").replace("\r", "\n")  # as subprocess.run(text=True) reads it


@contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k not in saved]:
            del os.environ[k]
        for k, v in saved.items():
            if os.environ.get(k) != v:
                os.environ[k] = v


@contextmanager
def _logging_to(out: io.TextIOBase, err: io.TextIOBase) -> Iterator[None]:
    """Logging handlers that write to this process's stdout/stderr write to ``out``/``err`` meanwhile."""
    moved = []
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for lg in loggers:
        for h in lg.handlers:
            if type(h) is logging.StreamHandler and h.stream in (
                sys.stderr,
                sys.__stderr__,
                sys.stdout,
                sys.__stdout__,
            ):
                moved.append((h, h.stream))
                h.setStream(out if h.stream in (sys.stdout, sys.__stdout__) else err)
    try:
        yield
    finally:
        for h, stream in moved:
            h.setStream(stream)


@contextmanager
def _warnings_shown() -> Iterator[None]:
    """Warnings print to (the redirected) stderr as a fresh process prints them, once per place."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]  # not pytest's recorder
        yield


def run_inline(
    args: Sequence[str], cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``hsstore ARGS`` in this process: its exit code, stdout and stderr, as ``subprocess.run`` gives them."""
    from hsstore.capture.run.driver import inline_workers
    from hsstore.cli.app import state
    from hsstore.cli.main import main

    out, err = _Stream(), _Stream()
    argv, debug, here = sys.argv, dict(state), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTSTP)}
    code = 0
    try:
        with (
            _environ(env),
            redirect_stdout(out),
            redirect_stderr(err),
            _logging_to(out, err),
            _warnings_shown(),
            inline_workers(),
        ):
            os.chdir(cwd if cwd is not None else here)
            sys.argv = ["hsstore", *map(str, args)]
            try:
                main()
            except SystemExit as e:
                code = _exit_code(e.code, err)
            except Exception:  # noqa: BLE001 - as an interpreter ends on an uncaught exception
                traceback.print_exc(file=err)
                code = 1
    finally:
        os.chdir(here)
        sys.argv = argv
        state.clear()
        state.update(debug)
        for s, h in handlers.items():
            signal.signal(s, h)
    return subprocess.CompletedProcess(["hsstore", *map(str, args)], code, out.text(), err.text())


def _exit_code(code: object, err: io.TextIOBase) -> int:
    """The status ``sys.exit(code)`` ends a process with."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=err)
    return 1

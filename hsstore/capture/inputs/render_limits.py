"""Time and memory limits on rendering a chat template: a template is a program (nested ``range(100000)``
loops, a string doubled in a loop), so every rendering runs under a watchdog that stops it with one line.

The watchdog is a thread that polls the clock and the process's resident memory and, past a limit, raises
an exception inside the rendering thread (``PyThreadState_SetAsyncExc``): jinja compiles templates to
Python loops, which see it at their next bytecode. The trade-off: a single C-level step (one huge string
multiplication) finishes before it is stopped, so memory can overshoot the limit by one step.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from hsstore.core.budget import parse_bytes
from hsstore.core.humanize import byte_size
from hsstore.core.errors import ResourceLimit

T = TypeVar("T")
SECONDS_ENV, BYTES_ENV = "HSSTORE_RENDER_SECONDS", "HSSTORE_RENDER_BYTES"
RENDER_SECONDS = 10.0  # one conversation renders in milliseconds; seconds mean a loop
RENDER_BYTES = 256 * 10**6  # memory one rendering may add, and characters its output may hold
POLL_SECONDS = 0.01


class _Stop(Exception):
    """Raised inside the rendering thread by the watchdog."""


def limits() -> tuple[float, int]:
    """(seconds, bytes) one rendering may take: the defaults, or HSSTORE_RENDER_SECONDS / _BYTES."""
    seconds = os.environ.get(SECONDS_ENV)
    size = os.environ.get(BYTES_ENV)
    try:
        s = float(seconds) if seconds else RENDER_SECONDS
    except ValueError:
        raise ResourceLimit(f"{SECONDS_ENV}={seconds!r} is not a number of seconds") from None
    return s, parse_bytes(size, BYTES_ENV) if size else RENDER_BYTES


def _resident() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0  # no way to ask: the time limit still holds


def _fire(ident: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


def bounded(render: Callable[[], str], what: str) -> str:
    """``render()`` stopped with ResourceLimit (exit 2) when it runs longer than the time limit, grows the
    process by more than the byte limit, or returns more characters than it."""
    seconds, size = limits()
    ident, start, base = threading.get_ident(), time.monotonic(), _resident()
    done, why = threading.Event(), []

    def watch() -> None:
        while not done.wait(POLL_SECONDS):
            if time.monotonic() - start > seconds:
                why.append(f"ran for more than {seconds:g} s")
            elif _resident() - base > size:
                why.append(f"grew memory by more than {byte_size(size)}")
            if why:
                _fire(ident, _Stop)
                return

    watcher = threading.Thread(target=watch, name="hsstore-render-watchdog", daemon=True)
    try:
        try:
            watcher.start()
            out = render()
        finally:
            done.set()
            watcher.join()
            _fire(ident, None)  # a stop that fired as the rendering finished must not land later
    except _Stop:
        out = None
    if out is None or len(out) > size:
        reason = why[0] if why else f"wrote more than {byte_size(size)} of text"
        raise ResourceLimit(f"the chat template {reason} rendering {what} (a loop, or text that doubles?); "
                            f"fix the template (limits: {SECONDS_ENV}, {BYTES_ENV})")
    return out

"""Time and memory limits on rendering a chat template: a template is a program (nested ``range(100000)``
loops, a string doubled in a loop), so every rendering runs under a watchdog that stops it with one line.

The watchdog is one thread per process that polls the clock and the process's resident memory and, past a limit, raises
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


class _Watch:
    """One rendering under watch: its limits, when it began, the memory it began at (sampled by the
    watchdog on first sight), and why it was stopped."""

    def __init__(self, seconds: float, size: int) -> None:
        self.seconds, self.size, self.start = seconds, size, time.monotonic()
        self.base: int | None = None
        self.why: list[str] = []


_lock = threading.Lock()
_active: dict[int, _Watch] = {}  # rendering thread's ident -> its watch
_watchdog: list[threading.Thread] = []  # one per process, started by the first rendering


def _watch_all() -> None:
    """The watchdog: every POLL_SECONDS, stop each rendering past its limit (once)."""
    while True:
        time.sleep(POLL_SECONDS)
        with _lock:
            for ident, w in _active.items():
                if w.why:
                    continue
                if w.base is None:  # memory is read here, not per rendering: most finish within one poll
                    w.base = _resident()
                if time.monotonic() - w.start > w.seconds:
                    w.why.append(f"ran for more than {w.seconds:g} s")
                elif _resident() - w.base > w.size:
                    w.why.append(f"grew memory by more than {byte_size(w.size)}")
                if w.why:
                    _fire(ident, _Stop)


def bounded(render: Callable[[], str], what: str) -> str:
    """``render()`` stopped with ResourceLimit (exit 2) when it runs longer than the time limit, grows the
    process by more than the byte limit, or returns more characters than it. One watchdog thread serves
    every rendering of the process (a thread per rendering cost ~250 us, more than a rendering)."""
    seconds, size = limits()
    ident, w = threading.get_ident(), _Watch(seconds, size)
    with _lock:
        if not _watchdog:
            _watchdog.append(threading.Thread(target=_watch_all, name="hsstore-render-watchdog", daemon=True))
            _watchdog[0].start()
        _active[ident] = w
    out: str | None = None
    try:
        try:
            out = render()
        finally:
            with _lock:
                _active.pop(ident, None)
            _fire(ident, None)  # a stop that fired as the rendering finished must not land later
    except _Stop:
        out = None
    finally:
        with _lock:
            _active.pop(ident, None)  # also when the stop landed inside the first removal
    if out is None or len(out) > size:
        reason = w.why[0] if w.why else f"wrote more than {byte_size(size)} of text"
        raise ResourceLimit(f"the chat template {reason} rendering {what} (a loop, or text that doubles?); "
                            f"fix the template (limits: {SECONDS_ENV}, {BYTES_ENV})")
    return out

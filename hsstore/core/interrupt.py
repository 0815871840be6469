"""Stop signals for commands that run in one process (convert, export, import): the first SIGTERM, SIGINT
or SIGHUP raises ``Stopped`` in the main thread, where the command stops its threads at the next unit
boundary and says what it kept; a second one exits at once (every commit is atomic, so nothing committed
is lost either way). A command stopped so exits with 128 + the signal's number (130 for Ctrl-C)."""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """Raised in the main thread by the first stop signal (a BaseException: no ``except Exception`` on the
    way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While active (in the main thread; elsewhere it does nothing): the first stop signal raises
    ``Stopped``, a second one ends the process with 128 + its number."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if seen:
            os._exit(128 + signum)
        seen.append(signum)
        raise Stopped(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --- A lock a forked child gets back unlocked.

_all: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


class ForkSafeLock:
    """``with lock:`` / ``acquire()`` / ``release()`` as a ``threading.Lock``; unlocked in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        _all.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()

    def locked(self) -> bool:
        return self.lock.locked()

    def __enter__(self) -> bool:
        return self.lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


def _fresh_in_child() -> None:
    for lock in list(_all):
        lock.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)

"""How an hsstore process stops. Stop signals for commands that run in one process (convert, export, import):
the first SIGTERM, SIGINT or SIGHUP raises ``Stopped`` in the main thread, where the command stops its threads
at the next unit boundary and says what it kept; a second one exits at once (every commit is atomic, so nothing
committed is lost either way). A command stopped so exits with 128 + the signal's number (130 for Ctrl-C).
And its end (``end_process``): without the interpreter's teardown of torch and transformers."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

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


# --- The end of a process: what the interpreter's exit does that matters, without its teardown


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives: None 0, an int itself, anything else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def end_process(code: int) -> NoReturn:
    """End this process with ``code`` as the interpreter's exit would, less its teardown: a process that imported
    torch and transformers spent 0.7-1.2 CPU-seconds freeing their modules and running libtorch's static
    destructors after its work was done (``/usr/bin/time python -c "import torch, transformers.modeling_utils"``
    with and without ``os._exit``). The exit handlers run (logging's flush, multiprocessing's children) and the
    standard streams are flushed (a failed flush is status 120, as the interpreter gives it); a process with a
    non-daemon thread still running exits the usual way, which waits for it."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # (the handlers the interpreter would run; a private but long-stable name)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # (None where the process started with that descriptor closed)
                stream.flush()
        except (OSError, ValueError):
            code = code or 120
    os._exit(code)


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

"""A lock a forked child gets back unlocked.

``os.fork()`` copies a process with one thread, but with every lock as it was: a lock another thread held
at that moment stays held in the child, where no thread will ever release it, and the child's first
``with lock:`` waits forever. A DataLoader forks its workers from the training process while a reading
thread may be inside a reader (opening a shard, caching a decoded chunk, compiling the FP8 kernel).
``ForkSafeLock`` is a ``threading.Lock`` that is made anew in the child, right after the fork, while the
child is still one thread.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

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

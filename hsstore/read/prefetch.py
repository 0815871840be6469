"""Items read in order, the next few already being read on threads (a streaming dataset's ``prefetch``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def _read_here(read: Callable[[int], T], i: int) -> Future[T]:
    done: Future[T] = Future()
    try:
        done.set_result(read(i))
    except Exception as e:  # noqa: BLE001 - raised where the item is handed out, as from a thread
        done.set_exception(e)
    return done


def in_order(read: Callable[[int], T], indices: Sequence[int], depth: int,
             at: Callable[[int], None] | None = None) -> Iterator[T]:
    """``read(i)`` for each of ``indices`` in order, the next ``depth`` read on threads meanwhile (in this
    thread once the interpreter is exiting: thread pools then take no new work). ``at(pos)`` is called
    before position ``pos`` is read."""
    if not depth:
        for pos, i in enumerate(indices):
            if at is not None:
                at(pos)
            yield read(i)
        return
    with ThreadPoolExecutor(depth, thread_name_prefix="hsstore-prefetch") as pool:
        window: deque[Future[T]] = deque()
        for pos, i in enumerate(indices):
            if at is not None:
                at(pos)
            try:
                window.append(pool.submit(read, i))
            except RuntimeError:  # the interpreter is exiting (an atexit handler reads)
                window.append(_read_here(read, i))
            if len(window) > depth:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()

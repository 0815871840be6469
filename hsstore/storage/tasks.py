"""Running one sample's read tasks: in the calling thread, or shared between it and a thread pool."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_shared(tasks: list[tuple[Any, ...]], pool: ThreadPoolExecutor | None, threads: int) -> None:
    """Call each ``(function, *args)``; with a ``pool``, this thread and up to ``threads - 1`` pool threads
    take tasks from one list until it is empty (the codecs, pread, crc32c and the FP8 loop release the
    GIL). Every task has ended when this returns or raises."""
    if pool is None:
        for fn, *args in tasks:
            fn(*args)
        return
    todo, lock = iter(tasks), threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                task = next(todo, None)
            if task is None:
                return
            task[0](*task[1:])

    helpers = []
    for _ in range(min(len(tasks), threads) - 1):
        try:
            helpers.append(pool.submit(drain))
        except RuntimeError:  # the interpreter is exiting (an atexit handler reads): this thread does the rest
            break
    try:
        drain()
    finally:
        for f in helpers:  # every task ends before its buffers are handed out (or an error is raised)
            f.exception()
    for f in helpers:
        f.result()


def pieces(offset: int, length: int, chunk_rows: int, row_bytes: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Rows ``[0, length)`` of a sample starting at row ``offset`` cut into ranges ``[a, b)`` of about
    ``piece_bytes`` of output (``row_bytes`` a row) on chunk boundaries: threads share a sample's layers
    and no chunk is decoded twice."""
    step = chunk_rows * max(1, piece_bytes // max(1, chunk_rows * row_bytes))
    cuts = [0, *range(step - offset % step, length, step), length]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_threads(cpus: int) -> int:
    """Threads one process decodes a sample's layers on: up to 8 of its ``cpus``. More did not pay: one
    rank on a 16-core host read slower with 16 than with 8 (docs/benchmarks.md, round 2)."""
    return max(1, min(8, cpus))


def worker_share(threads: int) -> int:
    """``threads`` divided among the DataLoader workers when this process is one of them (at least 1)."""
    from torch.utils.data import get_worker_info  # (the read path has imported torch by now)

    info = get_worker_info()
    return threads if info is None else max(1, threads // info.num_workers)


def process_pool(threads: int) -> tuple[ThreadPoolExecutor | None, int]:
    """(a pool of ``n - 1`` threads or None, ``n``): ``n`` this process's ``worker_share`` of ``threads``;
    the calling thread is the n-th."""
    n = worker_share(threads)
    return (ThreadPoolExecutor(n - 1, thread_name_prefix="hsstore-read") if n > 1 else None), n

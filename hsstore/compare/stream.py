"""Stream the shared samples of two variants through reading and arithmetic on every core, in order,
with bounded memory.

Each worker thread reads one sample of A and of B (decoding releases the GIL) and reduces it with
single-threaded torch ops (which release it too), so reading one sample overlaps the arithmetic of
others. Results come back in key order, so float sums over them are the same whatever the thread
count. torch's own intra-op threads are set to 1 while a stream runs: OpenMP teams spinning beside
the decoding threads cost more than they give on blocks that fit in cache (measured: 2 intra-op threads
on 2 cores were 5-30x slower than 1 under load). At most ``window`` samples and about
``budget_bytes`` of states are in flight (at least one sample, which is read whole).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch

from hsstore.core.dtypes import STORED
from hsstore.storage.store import VariantReader

R = TypeVar("R")
BYTES_PER_THREAD = 256 << 20  # states in flight per worker thread


def cpu_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_TORCH_THREADS_LOCK = threading.Lock()


@contextmanager
def torch_single_threaded() -> Iterator[None]:
    """torch intra-op parallelism off for the duration (restored after)."""
    with _TORCH_THREADS_LOCK:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sample_bytes(readers: Sequence[VariantReader], length: int, layers: Sequence[list[int]]) -> int:
    per_token = sum(STORED.get(r.record.dtype, STORED["fp32"]).itemsize * len(ls) for r, ls in zip(readers, layers))
    return length * readers[0].record.hidden_size * (per_token + 16)  # + float32 block work


def map_samples(readers: Sequence[VariantReader], keys: Sequence[str], layers: list[int] | list[list[int]],
                fn: Callable[[str, list[list[torch.Tensor]]], R], loss_only: bool = False,
                threads: int | None = None, budget_bytes: int | None = None) -> Iterator[R]:
    """``fn(key, [[states [T, H] of each layer] of each reader])`` for every key, in order; T counts the
    first reader's loss-masked tokens only when ``loss_only``. Reading and ``fn`` run on worker threads,
    each reading its sample's layers one after the other (no nested pools: one thread per core).
    ``layers``: the same layer ids for every reader, or one list per reader."""
    per_reader = layers if layers and isinstance(layers[0], list) else [layers] * len(readers)
    threads = threads or cpu_threads()
    budget = budget_bytes or BYTES_PER_THREAD * threads
    window = 2 * threads

    def task(key: str) -> R:
        states = [r.read_layers(r.refs[key], ls) for r, ls in zip(readers, per_reader)]
        if loss_only:
            _, mask = readers[0].read_tokens(readers[0].refs[key])
            sel = torch.from_numpy(mask.astype(np.bool_))
            states = [[t[sel] for t in per_layer] for per_layer in states]
        return fn(key, states)

    pending: deque[tuple[Future[R], int]] = deque()
    in_flight = 0
    with torch_single_threaded(), ThreadPoolExecutor(threads, thread_name_prefix="hsstore-diff") as pool:
        try:
            for key in keys:
                size = _sample_bytes(readers, readers[0].refs[key].length, per_reader)
                while pending and (len(pending) >= window or in_flight + size > budget):
                    fut, n = pending.popleft()
                    in_flight -= n
                    yield fut.result()
                pending.append((pool.submit(task, key), size))
                in_flight += size
            while pending:
                yield pending.popleft()[0].result()
        finally:
            for fut, _ in pending:
                fut.cancel()


class ThreadLocal:
    """One object per worker thread, made on first use (e.g. a kernel Workspace)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._local = threading.local()

    def get(self) -> Any:
        obj = getattr(self._local, "obj", None)
        if obj is None:
            obj = self._local.obj = self._make()
        return obj

"""Memory the shard reader reuses: a per-thread scratch buffer for chunk bytes, and recently decoded
chunks that hold many samples (so the next sample's read finds its chunk decoded)."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

import numpy as np

from hsstore.core.forksafe import ForkSafeLock


class Scratch:
    """A growable byte buffer one thread reuses for every chunk it reads (no allocation per chunk)."""

    def __init__(self) -> None:
        self.buf = bytearray(0)

    def view(self, n: int) -> memoryview:
        if len(self.buf) < n:
            self.buf = bytearray(max(n, 2 * len(self.buf)))
        return memoryview(self.buf)[:n]


_local = threading.local()


def scratch(use: str = "chunk") -> Scratch:
    """This thread's scratch buffer for ``use`` ("chunk": a chunk's stored bytes; "codes": FP8 codes on
    their way to bf16)."""
    s = getattr(_local, use, None)
    if s is None:
        s = Scratch()
        setattr(_local, use, s)
    return s


class DecodedChunks:
    """Recently decoded chunks that hold more rows than one read took (chunks of ~1 MiB hold many
    short samples at a small hidden size: the next sample's read finds its chunk decoded). Bounded by
    bytes, least recently used out first; committed chunks never change, so an entry never goes stale."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self.items: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.lock = ForkSafeLock()  # (a DataLoader may fork while a reading thread holds it)

    def get(self, key: tuple[int, int]) -> np.ndarray | None:
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
            return hit

    def put(self, key: tuple[int, int], chunk: np.ndarray) -> None:
        if chunk.nbytes > self.max_bytes // 4:
            return
        with self.lock:
            if key in self.items:
                return
            self.items[key] = chunk
            self.bytes += chunk.nbytes
            while self.bytes > self.max_bytes:
                _, old = self.items.popitem(last=False)
                self.bytes -= old.nbytes


DECODED = DecodedChunks(64 << 20)
_serials = itertools.count()


def next_serial() -> int:
    """A number naming one shard reader's chunks in ``DECODED`` (never reused in a process)."""
    return next(_serials)

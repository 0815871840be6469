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
    bytes, least recently used out first; committed chunks never change, so an entry never goes stale.
    A chunk every row of which has been read since it was decoded goes out at once, and its memory is
    the next decode's (memory just read is in the CPU's cache: decoding a 256 KiB chunk into it took
    ~130 us, into fresh memory ~160 us; docs/benchmarks.md, "Round 4 on 2 cores")."""

    def __init__(self, max_bytes: int, spares: int = 4) -> None:
        self.max_bytes, self.bytes, self.spares = max_bytes, 0, spares
        self.items: OrderedDict[tuple[int, int], tuple[np.ndarray, list[int]]] = OrderedDict()  # chunk, [rows unread]
        self.spare: list[np.ndarray] = []  # buffers of chunks gone out, the most recent last
        self.lock = ForkSafeLock()  # (a DataLoader may fork while a reading thread holds it)

    def copy_rows(self, key: tuple[int, int], first: int, dest: np.ndarray) -> bool:
        """Rows ``first .. first + len(dest)`` of chunk ``key`` copied into ``dest``; False if it is not held."""
        with self.lock:  # (copied under the lock: a buffer gone out is reused, never while read from)
            hit = self.items.get(key)
            if hit is None:
                return False
            chunk, unread = hit
            dest[...] = chunk[first : first + dest.shape[0]]
            unread[0] -= dest.shape[0]
            if unread[0] <= 0:  # every row read (in order, the chunk's last reader): out, its memory reused
                del self.items[key]
                self.bytes -= chunk.nbytes
                self._spare(chunk)
            else:
                self.items.move_to_end(key)
            return True

    def buffer(self, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
        """An array to decode a chunk into: the memory of one gone out if one fits, else new."""
        with self.lock:
            for i in range(len(self.spare) - 1, -1, -1):
                if self.spare[i].shape == shape and self.spare[i].dtype == dtype:
                    return self.spare.pop(i)
        return np.empty(shape, dtype)

    def put(self, key: tuple[int, int], chunk: np.ndarray, unread: int) -> None:
        """Hold ``chunk`` (from ``buffer``), ``unread`` of its rows not read yet."""
        if chunk.nbytes > self.max_bytes // 4:
            return
        with self.lock:
            if key in self.items:  # (another thread decoded it too)
                self._spare(chunk)
                return
            self.items[key] = (chunk, [unread])
            self.bytes += chunk.nbytes
            while self.bytes > self.max_bytes:
                _, (old, _) = self.items.popitem(last=False)
                self.bytes -= old.nbytes
                self._spare(old)

    def _spare(self, chunk: np.ndarray) -> None:
        self.spare.append(chunk)
        if len(self.spare) > self.spares:
            del self.spare[0]


DECODED = DecodedChunks(64 << 20)
_serials = itertools.count()


def next_serial() -> int:
    """A number naming one shard reader's chunks in ``DECODED`` (never reused in a process)."""
    return next(_serials)

"""Readahead for a known read order: the kernel reads the next samples' bytes while this one decodes.

A reader that asks for one sample at a time leaves the disk idle while it decodes, and one chunk read at
a time keeps only a shallow queue on it. Given the order, ``Readahead`` keeps about ``READAHEAD_BYTES``
of states (counted uncompressed: fewer bytes of a compressed variant's files) ahead of the sample being
read requested from the back end (``posix_fadvise(WILLNEED)`` on local files: asynchronous, no copy, the
data lands in the page cache), from one background thread so a request never blocks the reader. It is a
hint: what is read is still checked when it is read.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from hsstore.core.dtypes import STORED
from hsstore.storage.reader import SampleRef, VariantReader

# stored bytes requested ahead of the sample being read: ~0.1 s of a 2 GB/s disk, enough to keep its
# queue full while samples decode, small against a training host's page cache (8 ranks ask for 8x this)
READAHEAD_BYTES = 192 << 20


def hint(reader: VariantReader, ref: SampleRef, layers: list[int]) -> None:
    """Ask the back end to start reading ``ref``'s tokens and ``layers`` (local files: the kernel reads them in
    the background). A hint only: the read itself reports what is wrong."""
    try:
        for src, offset, n in reader.need_spans(ref, layers):
            src.will_need(offset, n)
    except Exception:  # noqa: BLE001 - see above
        pass


class Readahead:
    """Requests samples ahead of a reader walking ``refs`` in order (call ``at(i)`` before reading
    ``refs[i]``; ``close()`` when done)."""

    def __init__(self, reader: VariantReader, refs: Sequence[SampleRef], layers: list[int],
                 budget: int | None = None) -> None:
        self.reader, self.refs, self.layers = reader, refs, layers
        itemsize = 1 if reader.record.stored_precision else STORED[reader.record.dtype].itemsize  # FP8: 1-byte codes
        row = max(1, len(layers)) * reader.record.hidden_size * itemsize  # about the bytes a row reads
        self.sizes = [r.length * row for r in refs]
        self.budget = READAHEAD_BYTES if budget is None else budget
        self.next, self.ahead, self.counted = 0, 0, 0  # ahead: bytes of [counted, next)
        self.todo: queue.SimpleQueue[SampleRef | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="hsstore-readahead", daemon=True)
        self.thread.start()

    def at(self, i: int) -> None:
        """Sample ``i`` is about to be read: request it (if not yet) and the ones after it up to the budget."""
        for j in range(self.counted, min(i + 1, self.next)):  # no longer ahead
            self.ahead -= self.sizes[j]
        self.counted = max(self.counted, i + 1)
        while self.next < len(self.refs) and (self.next <= i or self.ahead < self.budget):
            self.todo.put(self.refs[self.next])
            if self.next > i:
                self.ahead += self.sizes[self.next]
            self.next += 1

    def _run(self) -> None:
        while (ref := self.todo.get()) is not None:
            hint(self.reader, ref, self.layers)

    def close(self) -> None:
        self.todo.put(None)
        self.thread.join()

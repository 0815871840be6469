"""The coming samples' stored bytes read while this one decodes, for map-style reads in a steady order.

A map-style dataset is asked for one sample at a time: read cold, each read waits on the disk and then
decodes, so the disk idles while the cores decode and the cores while it reads (2 cores, hidden 1024:
~0.27 s of disk and ~0.26 s of decoding made a 0.45 s pass; docs/notes/benchmarks-history.md, "Round 3 on 2 cores").
When the indices asked for advance by a constant step (in order: 1, from the second read),
``Lookahead`` reads the tokens and the stored chunks of the next indices, up to ``AHEAD_BYTES`` of
states, on one background thread (``pread`` releases the GIL) into reused buffers; those reads then
decode from there, every chunk still checked against its crc32c. Chunks already in the page cache are
left to the read (no second copy), other orders read nothing ahead, and a failed fetch only means the
read is done the ordinary way, which reports the problem on its own item (but a remote server that did
not answer the fetch is reported at once: the read would retry it as long again). A dataset holds at most two
budgets (fetched, and spare buffers while its order goes on); all of a process's datasets together at most
``PROCESS_BUDGETS``, the least recently read letting go first. A fork may come mid-fetch: the locks
involved are made anew in the child (hsstore.core.interrupt). On for bf16/fp16 states in
the main process: FP8 reads its own way, and a DataLoader worker's reads are already overlapped by the
DataLoader's prefetching (measured: looking ahead there too made 2 workers slower).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from torch.utils.data import get_worker_info

from hsstore.core.dtypes import STORED
from hsstore.core.errors import StoreUnreachable
from hsstore.core.interrupt import ForkSafeLock
from hsstore.storage import layout
from hsstore.storage.backend import BufferRange
from hsstore.storage.reader import VariantReader
from hsstore.storage.sample_table import SampleRef

# --- Readahead for a known read order: the kernel reads the next samples' bytes while this one decodes.

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

    def __init__(
        self, reader: VariantReader, refs: Sequence[SampleRef], layers: list[int], budget: int | None = None
    ) -> None:
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


# samples of fewer stored bytes are read without looking ahead (a hand-off costs more than it saves)
MIN_BYTES = 4 << 20
AHEAD_BYTES = 64 << 20  # bytes of states of the coming samples fetched ahead (at least one sample)
MAX_SAMPLES = 64  # nor more samples than this ahead
PROCESS_BUDGETS = 6  # all datasets of a process hold at most this many budgets ahead (least recently read let go)

_live: weakref.WeakSet[Lookahead] = weakref.WeakSet()
_registry = ForkSafeLock()  # (_live is added to and listed from several threads)
_ticks = itertools.count()

if hasattr(os, "register_at_fork"):  # a child's datasets start their own (hsstore.read.dataset): forget the parent's
    os.register_at_fork(after_in_child=_live.clear)


def _share(active: Lookahead) -> None:
    """Datasets reading ahead share ``PROCESS_BUDGETS`` budgets: while they hold more, the least recently read
    ones let go of what they hold (datasets read a little in order and kept would each hold a budget)."""
    with _registry:
        others = sorted((a for a in _live if a is not active and (a.ahead or a.free)), key=lambda a: a.tick)
    total = active.held() + sum(a.held() for a in others)
    for a in others:
        if total <= PROCESS_BUDGETS * active.budget:
            return
        total -= a.drop()


@dataclass
class Fetched:
    """One sample read ahead: its checked tokens and its layers' chunk bytes (not yet checked)."""

    tokens: tuple[np.ndarray, np.ndarray]
    chunks: dict[str, BufferRange]


def fetch(
    reader: VariantReader,
    ref: SampleRef,
    layers: list[int],
    buffer: Callable[[int], bytearray],
    last: dict[str, tuple[str, int]],
) -> Fetched:
    """``ref``'s tokens (``read_tokens``) and the bytes of its chunks of each of ``layers``, read now into
    ``buffer(n)``s. ``last``: array name -> (unit, offset) of the last chunk fetched before; a sample's
    first chunk that is the one before's last is not fetched again (that read decodes it for both)."""
    out = Fetched(reader.read_tokens(ref), {})
    for name in (layout.layer_array(i) for i in layers):
        shard = reader.shard(ref.unit, name)
        a, b = ref.offset, ref.offset + ref.length
        first, end = a // shard.chunk_rows, (b - 1) // shard.chunk_rows
        if last.get(name) == (ref.unit, shard.spans[first][0]) and first < end:
            a = (first + 1) * shard.chunk_rows
        span = shard.need_span(a, b)
        if span is not None and not shard.src.cached(*span):  # (in memory already: the read copies it once)
            buf = buffer(span[1])
            got = shard.src.readinto([memoryview(buf)[: span[1]]], span[0])
            shard.bytes_read += got
            out.chunks[name] = BufferRange(buf, span[0], got)
        last[name] = (ref.unit, shard.spans[end][0])
    return out


class Lookahead:
    """Fetches the coming indices' bytes when the indices ``take`` sees advance by a constant step."""

    def __init__(self, reader: VariantReader, layers: list[int], budget: int | None = None) -> None:
        self.reader, self.layers, self.budget = reader, layers, AHEAD_BYTES if budget is None else budget
        rec = reader.record
        self.row_bytes = len(layers) * rec.hidden_size * STORED[rec.dtype].itemsize
        self.on = not rec.stored_precision and bool(layers) and get_worker_info() is None
        self.last: int | None = None
        self.step: int | None = None
        self.going = False  # the order is steady and has samples left: what is fetched is kept
        self.ahead: dict[int, Future[Fetched]] = {}  # index -> its fetch, in order
        self.lock = ForkSafeLock()  # (a fork may come while the fetch thread holds it)
        self.pool: ThreadPoolExecutor | None = None
        self.pid = os.getpid()
        self.used = 0  # reads served from what was fetched ahead
        self.fetched_bytes = 0  # chunk bytes fetched (chunks found in the page cache are not)
        self.last_chunks: dict[str, tuple[str, int]] = {}  # (fetch's ``last``: the fetch thread's own)
        self.free: list[bytearray] = []  # buffers of reads that are done, reused (no page faults anew)
        self.tick = next(_ticks)  # when this was last read (_share lets the least recent go first)
        with _registry:
            _live.add(self)

    def take(self, index: int) -> Fetched | None:
        """What was fetched ahead for ``index`` (None if nothing); keeps fetching the next ones while the order
        is steady. A failed fetch gives None: the read itself then reports the problem, on this item (a server
        that did not answer the fetch's retries raises StoreUnreachable here, without retrying it all again)."""
        with self.lock:
            mine = self.ahead.pop(index, None)
            step = None if self.last is None else index - self.last
            steady = step == 1 or (step is not None and step != 0 and step == self.step)
            # a pass begun at the start (the first read, or after one to the end): in order, as a rule
            ahead = step if steady else 1 if index == 0 and self.last in (None, len(self.reader.keys) - 1) else None
            self.last, self.step, self.tick = index, step, next(_ticks)
            self.going = ahead is not None and self.on and 0 <= index + ahead < len(self.reader.keys)
            queued = self.going and ahead is not None and self._extend(index, ahead)  # (going: ahead is set)
            if not self.going:  # the order broke or ended: nothing ahead, no thread kept waiting
                self._release()
        if queued:
            _share(self)
        if mine is None:
            self._ask_kernel(index)
            return None
        try:
            got = mine.result()
        except StoreUnreachable:  # the fetch tried the server as long as the read would: its answer is the read's
            raise
        except Exception:  # noqa: BLE001 - read again the ordinary way, which says what is wrong
            return None
        self.used += 1
        return got

    def _ask_kernel(self, index: int) -> None:
        """A read with nothing fetched (a pass's first, or another order): the kernel is asked for all of its
        chunks at once (``will_need``), not one layer after another as the read reaches them (a cold pass's
        first sample, hidden 1024, with the fetch from index 0: 35-38 ms before, 17-23 ms after;
        docs/notes/benchmarks-history.md, "Round 4 on 2 cores")."""
        local = self.reader.store.is_local  # (an object store reads what it is asked for, no sooner)
        if self.on and local and self.reader.ref(index).length * self.row_bytes >= MIN_BYTES:
            hint(self.reader, self.reader.ref(index), self.layers)

    def _extend(self, index: int, step: int) -> bool:
        """Fetches queued for ``index + step``, ``index + 2 step``, ... up to ``budget`` bytes of states, as far
        as the first sample under ``MIN_BYTES``; whether any was queued now."""
        n, held, queued = len(self.reader.keys), 0, False
        for nxt in range(index + step, index + step * (MAX_SAMPLES + 1), step):
            if not 0 <= nxt < n:
                break
            size = self.reader.ref(nxt).length * self.row_bytes
            if size < MIN_BYTES or (held and held + size > self.budget):
                break  # (a small sample is read on its own; the ones after it are fetched when it is read)
            held += size
            if nxt not in self.ahead:
                if self.pool is None:
                    self.pool = ThreadPoolExecutor(1, thread_name_prefix="hsstore-lookahead")
                try:
                    self.ahead[nxt], queued = self.pool.submit(self._fetch, self.reader.ref(nxt)), True
                except RuntimeError:  # the interpreter is exiting: no new thread work, reads go on without
                    break
        return queued

    def held(self) -> int:
        """Bytes held for reading ahead: states fetched or queued (as computed), and spare buffers."""
        with self.lock:
            return sum(self.reader.ref(i).length for i in self.ahead) * self.row_bytes + sum(map(len, self.free))

    def drop(self) -> int:
        """Let go of what was fetched or queued ahead and of the spare buffers; returns what that held."""
        held = self.held()
        with self.lock:
            self._release()
        return held

    def _release(self) -> None:
        """(Under ``lock``.) Nothing fetched ahead any more: queued fetches cancelled, one in flight ends unused,
        and the thread then ends (a steady order starts another)."""
        for f in self.ahead.values():
            f.cancel()
        self.ahead, self.free = {}, []
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=False)  # (the fetch a read has taken still ends: it is not cancelled)

    def _fetch(self, ref: SampleRef) -> Fetched:
        got = fetch(self.reader, ref, self.layers, self._buffer, self.last_chunks)
        self.fetched_bytes += sum(r.size - r.base for r in got.chunks.values())
        return got

    def _buffer(self, n: int) -> bytearray:
        with self.lock:
            fit = [b for b in self.free if len(b) >= n]
            if fit:
                buf = min(fit, key=len)
                self.free.remove(buf)
                return buf
        return bytearray(n)

    def done(self, fetched: Fetched | None) -> None:
        """The read that took ``fetched`` has ended: its buffers may be filled again (kept while the order goes on)."""
        if fetched is None:
            return
        with self.lock:
            if not self.going:
                self.free = []  # the pass has ended: a dataset kept for later holds no memory for it
                return
            self.free += [r.data for r in fetched.chunks.values() if isinstance(r.data, bytearray)]
            while sum(len(b) for b in self.free) > self.budget:  # (with those in flight: ~2x budget held at most)
                self.free.pop(0)

    def close(self) -> None:
        """Stop the background thread (after the fetch in flight, if any)."""
        with self.lock:
            pool = self.pool
            self._release()
        if pool is not None:
            pool.shutdown(wait=True)


# --- Items read in order, the next few already being read on threads (a streaming dataset's ``prefetch``).

T = TypeVar("T")


def _read_here(read: Callable[[int], T], i: int) -> Future[T]:
    done: Future[T] = Future()
    try:
        done.set_result(read(i))
    except Exception as e:  # noqa: BLE001 - raised where the item is handed out, as from a thread
        done.set_exception(e)
    return done


def in_order(
    read: Callable[[int], T], indices: Sequence[int], depth: int, at: Callable[[int], None] | None = None
) -> Iterator[T]:
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

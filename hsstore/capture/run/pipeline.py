"""The capture pipeline: forward batches -> per-unit device buffers -> async copy into reused pinned
host memory (hsstore.capture.run.pipeline) -> background writer threads (one unit each, in parallel). The GPU
never waits on compression or disk; it waits only when the writers fall more than a few units behind
(back-pressure instead of unbounded memory).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from hsstore.capture.run.hooks import LayerCapture, pad_batch
from hsstore.capture.run.progress import Progress
from hsstore.core.batching import flush_due, padded_length
from hsstore.core.quant import Quantized, dequantize, error_tensor, from_error_tensor, quantize
from hsstore.core.schema.build import CaptureResult
from hsstore.storage.stats import stats_tensor

# --- Page-locked host memory for the capture pipeline: a pool of reused pinned buffers, buffers reserved


def pinned_size(nbytes: int) -> int:
    """What to ask for: torch's pinned-memory allocator rounds every block up to a power of two
    (ATen/core/CachingHostAllocator.h), so asking for exactly that makes the buffer's size its real
    capacity (and lets it serve more)."""
    return 1 << max(0, nbytes - 1).bit_length()


class PinnedPool:
    """Reused page-locked host buffers (cudaHostAlloc is slow; allocating one per unit would stall)."""

    def __init__(self) -> None:
        self.free: list[torch.Tensor] = []
        self.lock = threading.Lock()
        self.alloc_seconds = 0.0  # time spent allocating (reported: it is part of a build's fixed cost)

    def take(self, nbytes: int) -> torch.Tensor:
        with self.lock:
            for i, buf in enumerate(self.free):
                if buf.numel() >= nbytes:
                    return self.free.pop(i)
        t0 = time.perf_counter()
        buf = self.allocate(nbytes)
        self.alloc_seconds += time.perf_counter() - t0
        return buf

    @staticmethod
    def allocate(nbytes: int) -> torch.Tensor:
        return torch.empty(pinned_size(nbytes), dtype=torch.uint8, pin_memory=True)

    def give(self, buf: torch.Tensor) -> None:
        with self.lock:
            self.free.append(buf)

    def shortfall(self, sizes: Sequence[int]) -> list[int]:
        """The sizes that the free buffers do not already cover (largest first, one buffer each)."""
        with self.lock:
            have = sorted((b.numel() for b in self.free), reverse=True)
        missing = []
        for n in sorted(sizes, reverse=True):
            if have and have[0] >= n:
                have.pop(0)
            else:
                missing.append(n)
        return missing

    def reserve_in_background(self, sizes: Sequence[int], device: str | None = None) -> PinnedReservation:
        """Start allocating buffers of ``sizes`` bytes on a thread (overlapping, e.g., the model load).
        ``device``: the GPU this process uses (a new thread's current device is cuda:0, whose context
        it would otherwise create)."""
        return PinnedReservation(self, sizes, device)


class PinnedReservation:
    """Buffers allocated ahead of the capture loop; ``wait()`` joins and reports what it cost.
    A failure (e.g. too little lockable memory) is reported, not raised: the loop allocates on demand."""

    def __init__(self, pool: PinnedPool, sizes: Sequence[int], device: str | None = None) -> None:
        self.pool, self.sizes, self.device = pool, list(sizes), device
        self.seconds = 0.0
        self.allocated = 0  # bytes: what the pool's free buffers did not already cover
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            if self.device is not None and self.device.startswith("cuda"):
                torch.cuda.set_device(self.device)
            for n in self.pool.shortfall(self.sizes):
                buf = self.pool.allocate(n)
                self.pool.give(buf)
                self.allocated += buf.numel()
        except Exception as e:  # noqa: BLE001 - on-demand allocation still works
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = time.perf_counter() - t0

    def wait(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.thread.join()
        return {
            "pinned_reserve_seconds": self.seconds,
            "pinned_reserve_wait_seconds": time.perf_counter() - t0,
            "pinned_reserve_bytes": self.allocated,
            "pinned_reserve_error": self.error,
        }


# what a BackgroundWriter's thread writes: (samples, states, copy events, pinned buffers, health, quant error,
# the unit's place among the writer's units)
_Unit = tuple[
    list[Any],
    dict[int, Any],
    list[torch.cuda.Event],
    list[torch.Tensor],
    dict[int, torch.Tensor] | None,
    dict[int, torch.Tensor] | None,
    int,
]
PINNED_POOL = PinnedPool()  # shared by every capture in this process: buffers outlive one variant


def copy_to_host(
    states: dict[int, Any], pool: PinnedPool
) -> tuple[dict[int, Any], list[torch.Tensor], list[torch.cuda.Event]]:
    """Asynchronous device-to-host copies of a unit's states (tensors or Quantized) into pinned
    buffers from ``pool``. Returns (host states, the buffers to give back, one event per GPU)."""
    bufs: list[torch.Tensor] = []

    def host(t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        buf = pool.take(nbytes)
        bufs.append(buf)
        h = buf[:nbytes].view(t.dtype).view(t.shape)
        h.copy_(t, non_blocking=True)
        return h

    out: dict[int, Any] = {}
    devices: set[torch.device] = set()
    for i, t in states.items():
        if isinstance(t, Quantized):
            out[i] = Quantized(host(t.codes), host(t.scales))
            devices.add(t.codes.device)
        else:
            out[i] = host(t)
            devices.add(t.device)
    events: list[torch.cuda.Event] = []
    for dev in devices:  # copies run on the stream of each state's own GPU: one event per GPU
        with torch.cuda.device(dev):
            events.append(torch.cuda.Event())  # type: ignore[no-untyped-call]  # unannotated in torch
            events[-1].record(torch.cuda.current_stream(dev))
    return out, bufs, events


class BackgroundWriter:
    """Writes units on a thread so compression and disk overlap the next forward; bounded queue."""

    def __init__(self, writer: Any, threads: int = 2, pool: PinnedPool | None = None) -> None:
        self.writer, self.pool = writer, pool
        self.q: queue.Queue[_Unit | None] = queue.Queue(maxsize=threads + 1)  # None: a thread's stop
        self.error: BaseException | None = None
        self.written = 0
        self.bytes = 0
        self.write_seconds = 0.0
        self.stats_lock = threading.Lock()
        self.closed = False
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                self.q.task_done()
                return
            samples, states, events, bufs, health, quant_error, seq = item
            try:
                if self.error is None:
                    for event in events:
                        event.synchronize()  # the async device-to-host copies have landed
                    t0 = time.time()
                    extra = (
                        {}
                        if quant_error is None
                        else {"quant_error": {i: from_error_tensor(t.tolist()) for i, t in quant_error.items()}}
                    )
                    commit = self.writer.write(samples, states, health=health, seq=seq, **extra)
                    with self.stats_lock:
                        self.write_seconds += time.time() - t0
                        if commit is not None:
                            self.written += len(commit.samples)
                            self.bytes += sum(commit.files.values())
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                self.error = e
            finally:
                if self.pool is not None:  # the buffers are this pool's (none without one)
                    for b in bufs:
                        self.pool.give(b)
                self.q.task_done()

    def put(
        self,
        samples: list[Any],
        states: dict[int, Any],
        events: list[torch.cuda.Event],
        bufs: list[torch.Tensor],
        health: dict[int, torch.Tensor] | None = None,
        quant_error: dict[int, torch.Tensor] | None = None,
    ) -> None:
        if self.error is not None:
            raise self.error
        # its place among the units taken now, in batch order: two threads write, either may commit first
        self.q.put((samples, states, events, bufs, health, quant_error, self.writer.reserve()))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for _ in self.threads:
                self.q.put(None)
            for t in self.threads:
                t.join()
        if self.error is not None:
            raise self.error


def unit_payload(
    states: dict[int, torch.Tensor], lengths: list[int], precision: str | None, on_gpu: bool
) -> tuple[dict[int, Any], dict[int, torch.Tensor] | None, dict[int, torch.Tensor] | None]:
    """What a unit's writer gets, computed where the states are (on a GPU: no host sync): the states
    (as computed, or quantized to ``precision``), their health statistics (of the states as computed;
    None on the CPU as computed: the writer computes them) and, when quantized, the storage error
    (``quant_error.error_tensor`` per layer)."""
    health = {i: stats_tensor(t, lengths) for i, t in states.items()} if (on_gpu or precision) else None
    if not precision:
        return states, health, None
    out, err = {}, {}
    for i, t in states.items():
        q = quantize(t)
        err[i] = error_tensor(t, dequantize(q, torch.float32))
        out[i] = q
    return out, health, err


class UnitBuffer:
    """The unit being collected: each written sample's states per captured layer, handed to the
    background writer (quantized and copied to pinned host memory first on a GPU) when it flushes."""

    def __init__(self, layers: list[int], bg: BackgroundWriter, precision: str | None, pool: PinnedPool | None) -> None:
        self.layers, self.bg, self.precision, self.pool = layers, bg, precision, pool
        self._reset()

    def _reset(self) -> None:
        self.samples: list[Any] = []
        self.states: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}
        self.tokens = 0

    def add(self, sample: Any, out: dict[int, torch.Tensor], row: int) -> None:
        """Keep ``sample``'s states: row ``row`` of the batch output, cut to its length."""
        n = sample.length
        for layer in self.layers:
            self.states[layer].append(out[layer][row, :n])
        self.samples.append(sample)
        self.tokens += n

    def add_batch(
        self,
        samples: Sequence[Any],
        batch: Sequence[int],
        out: dict[int, torch.Tensor],
        skip: set[str] | frozenset[str],
    ) -> None:
        """Keep the states of each sample of ``batch`` (row r of ``out`` is ``samples[batch[r]]``) whose key is not
        in ``skip`` (computed because its batch needs it, not written)."""
        for row, i in enumerate(batch):
            if samples[i].key not in skip:
                self.add(samples[i], out, row)

    def due(self, unit_tokens: int, remaining: int) -> bool:
        """Whether to flush now. Once fewer than a unit's tokens are left to compute, units flush at a
        quarter of the size: their writes overlap the last forwards, and the tail (the last unit's copy
        and write after the last forward, a fixed cost of every build) holds at most a quarter unit plus
        one batch."""
        return flush_due(self.tokens, unit_tokens, remaining)

    def flush(self) -> None:
        if not self.samples:
            return
        states = {i: torch.cat(self.states[i]) for i in self.layers}
        cuda = self.pool is not None
        payload, health, err = unit_payload(states, [s.length for s in self.samples], self.precision, cuda)
        events: list[torch.cuda.Event] = []
        bufs: list[torch.Tensor] = []
        if self.pool is not None:  # (cuda) health and error stats travel with the states
            health = None if health is None else {i: h.to("cpu", non_blocking=True) for i, h in health.items()}
            err = None if err is None else {i: e.to("cpu", non_blocking=True) for i, e in err.items()}
            payload, bufs, events = copy_to_host(payload, self.pool)
        self.bg.put(self.samples, payload, events, bufs, health, err)
        self._reset()


class LoopClock:
    """A capture loop's timings: the first batch (one-off kernel JIT, autotuning, allocator growth), the
    steady state (from the end of the first batch to the last forward), the tail (the last unit's copy
    and write after the last forward), the padded batch shapes run (a new one compiles kernels)."""

    def __init__(self, device: str, pool: PinnedPool | None, progress: Progress | None) -> None:
        self.device, self.pool, self.progress = device, pool, progress
        self.cuda = device.startswith("cuda")
        self.t0 = time.time()
        self.first_batch_seconds: float | None = None
        self.tail_seconds: float | None = None
        self.steady_tokens, self.steady_seconds = 0, 0.0
        self.shapes: set[tuple[int, int]] = set()
        self.t_first: float | None = None
        self.t_tail = 0.0
        self.alloc0 = pool.alloc_seconds if pool is not None else 0.0
        self.gpus: set[torch.device] = set()  # the input GPU and the GPUs holding captured layers

    def shape(self, rows: int, width: int) -> None:
        if self.cuda and (rows, width) not in self.shapes and self.progress is not None:
            self.progress.note(f"compiling kernels for batch shape {rows}x{width} (first batch of this shape)")
        self.shapes.add((rows, width))

    def _sync(self) -> None:
        for dev in self.gpus:
            torch.cuda.synchronize(dev)

    def batch_done(self, out: dict[int, torch.Tensor], batch_tokens: int) -> None:
        if self.first_batch_seconds is None:  # one host sync per build: kernel JIT and autotuning
            if self.cuda:
                self.gpus = {t.device for t in out.values()} | {torch.device(self.device)}
            self._sync()
            self.t_first = time.time()
            self.first_batch_seconds = self.t_first - self.t0
        else:
            self.steady_tokens += batch_tokens

    def forwards_done(self) -> None:
        self._sync()
        self.t_tail = time.time()  # the last forward is done: what follows is the last unit's copy and write
        if self.t_first is not None:
            self.steady_seconds = self.t_tail - self.t_first

    def tail_done(self) -> None:
        self.tail_seconds = time.time() - self.t_tail

    def summary(self, bg: BackgroundWriter) -> CaptureResult:
        return CaptureResult(
            samples_written=bg.written,
            bytes=bg.bytes,
            loop_seconds=time.time() - self.t0,
            writer_busy_seconds=bg.write_seconds,
            first_batch_seconds=self.first_batch_seconds,
            tail_seconds=self.tail_seconds,
            steady_tokens=self.steady_tokens,
            steady_seconds=self.steady_seconds,
            batch_shapes=len(self.shapes),
            pinned_alloc_seconds=(self.pool.alloc_seconds - self.alloc0) if self.pool is not None else 0.0,
        )


def batch_inputs(
    samples: Sequence[Any], batch: Sequence[int], pad_id: int, device: str, bucketed: bool, clock: LoopClock
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's padded input ids and attention mask on ``device``: padded to
    ``batching.padded_length`` of its longest sample when ``bucketed``, else to the longest."""
    seqs = [torch.from_numpy(samples[i].input_ids.astype("int64")) for i in batch]
    longest = max(int(x.shape[0]) for x in seqs)
    width = padded_length(longest) if bucketed else longest
    clock.shape(len(batch), width)
    return pad_batch(seqs, pad_id, device, width)


def capture_to_store(
    model: Any,
    num_layers: int,
    layers: Sequence[int],
    samples: Sequence[Any],
    batches: Sequence[Sequence[int]],
    writer: Any,
    device: str,
    pad_id: int,
    unit_tokens: int,
    skip: set[str] | frozenset[str] = frozenset(),
    progress: Progress | None = None,
    writer_threads: int = 2,
    precision: str | None = None,
    bucketed: bool = True,
) -> CaptureResult:
    """Run ``batches`` (lists of indices into ``samples``), capture ``layers``, write units of about
    ``unit_tokens`` tokens through ``writer``. Samples whose key is in ``skip`` are computed (their
    batch needs them) but not written. ``device`` takes the inputs; captured layers may live on other
    GPUs (a model spread over several). ``precision``: store quantized (e.g. "fp8-e4m3", quantized
    on the device before the copy) with the error measured per unit. ``bucketed``: pad each batch to
    ``batching.padded_length`` of its longest sample, as the plan was made. Returns what it wrote and where the time went."""
    layers = sorted(set(layers))
    cap = LayerCapture(model, num_layers, layers)
    pool = PINNED_POOL if device.startswith("cuda") else None
    bg = BackgroundWriter(writer, threads=writer_threads, pool=pool)
    unit = UnitBuffer(layers, bg, precision, pool)
    clock = LoopClock(device, pool, progress)
    remaining = sum(samples[i].length for b in batches for i in b)
    try:
        for batch in batches:
            out = cap.run(*batch_inputs(samples, batch, pad_id, device, bucketed, clock))
            unit.add_batch(samples, batch, out, skip)
            batch_tokens = sum(samples[i].length for i in batch)
            remaining -= batch_tokens
            if unit.due(unit_tokens, remaining):
                unit.flush()
            if progress is not None:
                progress.advance(len(batch), batch_tokens)
            clock.batch_done(out, batch_tokens)
        clock.forwards_done()
        unit.flush()
        bg.close()
        clock.tail_done()
    finally:
        bg.close()
        cap.close()
        if progress is not None:
            progress.close()
    return clock.summary(bg)

"""The capture pipeline: forward batches -> per-unit device buffers -> async copy into reused pinned
host memory -> background writer threads (one unit each, in parallel). The GPU never waits on
compression or disk; it waits only when the writers fall more than a few units behind (back-pressure
instead of unbounded memory).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from hsstore.build.capture import LayerCapture, pad_batch
from hsstore.build.progress import Progress
from hsstore.core.batching import padded_length
from hsstore.core.quant import Quantized, dequantize, quantize
from hsstore.core.quant_error import error_tensor, from_error_tensor
from hsstore.storage.stats import stats_tensor


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

    def reserve_in_background(self, sizes: Sequence[int], device: str | None = None) -> "PinnedReservation":
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
        return {"pinned_reserve_seconds": self.seconds, "pinned_reserve_wait_seconds": time.perf_counter() - t0,
                "pinned_reserve_bytes": self.allocated, "pinned_reserve_error": self.error}


PINNED_POOL = PinnedPool()  # shared by every capture in this process: buffers outlive one variant


class BackgroundWriter:
    """Writes units on a thread so compression and disk overlap the next forward; bounded queue."""

    def __init__(self, writer: Any, threads: int = 2, pool: PinnedPool | None = None) -> None:
        self.writer, self.pool = writer, pool
        self.q: queue.Queue = queue.Queue(maxsize=threads + 1)
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
            samples, states, events, bufs, health, quant_error = item
            try:
                if self.error is None:
                    for event in events:
                        event.synchronize()  # the async device-to-host copies have landed
                    t0 = time.time()
                    extra = {} if quant_error is None else {
                        "quant_error": {i: from_error_tensor(t.tolist()) for i, t in quant_error.items()}}
                    commit = self.writer.write(samples, states, health=health, **extra)
                    with self.stats_lock:
                        self.write_seconds += time.time() - t0
                        if commit is not None:
                            self.written += len(commit.samples)
                            self.bytes += sum(commit.files.values())
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                self.error = e
            finally:
                for b in bufs:
                    self.pool.give(b)
                self.q.task_done()

    def put(self, samples: list, states: dict, events: list, bufs: list, health: Any = None,
            quant_error: Any = None) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((samples, states, events, bufs, health, quant_error))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for _ in self.threads:
                self.q.put(None)
            for t in self.threads:
                t.join()
        if self.error is not None:
            raise self.error


def unit_payload(states: dict[int, torch.Tensor], lengths: list[int], precision: str | None,
                 on_gpu: bool) -> tuple[dict[int, Any], dict[int, torch.Tensor] | None, dict[int, torch.Tensor] | None]:
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


def copy_to_host(states: dict[int, Any], pool: PinnedPool) -> tuple[dict[int, Any], list, list]:
    """Asynchronous device-to-host copies of a unit's states (tensors or Quantized) into pinned
    buffers from ``pool``. Returns (host states, the buffers to give back, one event per GPU)."""
    bufs: list = []

    def host(t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        buf = pool.take(nbytes)
        bufs.append(buf)
        h = buf[:nbytes].view(t.dtype).view(t.shape)
        h.copy_(t, non_blocking=True)
        return h

    out: dict[int, Any] = {}
    devices = set()
    for i, t in states.items():
        if isinstance(t, Quantized):
            out[i] = Quantized(host(t.codes), host(t.scales))
            devices.add(t.codes.device)
        else:
            out[i] = host(t)
            devices.add(t.device)
    events = []
    for dev in devices:  # copies run on the stream of each state's own GPU: one event per GPU
        with torch.cuda.device(dev):
            events.append(torch.cuda.Event())
            events[-1].record(torch.cuda.current_stream(dev))
    return out, bufs, events


def capture_to_store(
    model: Any, num_layers: int, layers: Sequence[int], samples: Sequence[Any], batches: Sequence[Sequence[int]],
    writer: Any, device: str, pad_id: int, unit_tokens: int, skip: set[str] | frozenset[str] = frozenset(),
    progress: Progress | None = None, writer_threads: int = 2, precision: str | None = None, bucketed: bool = True,
) -> dict[str, Any]:
    """Run ``batches`` (lists of indices into ``samples``), capture ``layers``, write units of about
    ``unit_tokens`` tokens through ``writer``. Samples whose key is in ``skip`` are computed (their
    batch needs them) but not written. ``device`` takes the inputs; captured layers may live on other
    GPUs (a model spread over several). ``precision``: store quantized (e.g. "fp8-e4m3", quantized
    on the device before the copy) with the error measured per unit. ``bucketed``: pad each batch to
    ``batching.padded_length`` of its longest sample, as the plan was made. Returns counts and timings."""
    layers = sorted(set(layers))
    cap = LayerCapture(model, num_layers, layers)
    cuda = device.startswith("cuda")
    pool = PINNED_POOL if cuda else None
    bg = BackgroundWriter(writer, threads=writer_threads, pool=pool)
    unit: dict[str, Any] = {"samples": [], "states": {i: [] for i in layers}, "tokens": 0}

    def flush() -> None:
        if not unit["samples"]:
            return
        states = {i: torch.cat(unit["states"][i]) for i in layers}
        payload, health, err = unit_payload(states, [s.length for s in unit["samples"]], precision, cuda)
        events, bufs = [], []
        if cuda:  # health and error stats travel with the states
            health = {i: h.to("cpu", non_blocking=True) for i, h in health.items()}
            err = None if err is None else {i: e.to("cpu", non_blocking=True) for i, e in err.items()}
            payload, bufs, events = copy_to_host(payload, pool)
        bg.put(unit["samples"], payload, events, bufs, health, err)
        unit.update(samples=[], states={i: [] for i in layers}, tokens=0)

    t0 = time.time()
    timing: dict[str, Any] = {"first_batch_seconds": None, "tail_seconds": None}
    # steady state: from the end of the first batch (one-off JIT, allocator growth) to the last forward
    steady = {"steady_tokens": 0, "steady_seconds": 0.0}
    shapes: set[tuple[int, int]] = set()  # padded batch shapes run so far: a new one compiles kernels
    t_first = None
    alloc0 = pool.alloc_seconds if pool is not None else 0.0
    gpus: set = set()  # the input GPU and the GPUs holding captured layers

    def sync() -> None:
        for dev in gpus:
            torch.cuda.synchronize(dev)

    # once fewer than a unit's tokens are left to compute, units flush at a quarter of the size: their
    # writes overlap the last forwards, and the tail (the last unit's copy and write after the last
    # forward, a fixed cost of every build) holds at most a quarter unit plus one batch
    remaining = sum(samples[i].length for b in batches for i in b)
    try:
        for batch in batches:
            seqs = [torch.from_numpy(samples[i].input_ids.astype("int64")) for i in batch]
            longest = max(int(x.shape[0]) for x in seqs)
            width = padded_length(longest) if bucketed else longest
            if cuda and (len(batch), width) not in shapes and progress is not None:
                progress.note(f"compiling kernels for batch shape {len(batch)}x{width} (first batch of this shape)")
            shapes.add((len(batch), width))
            ids, mask = pad_batch(seqs, pad_id, device, width)
            out = cap.run(ids, mask)
            for b, i in enumerate(batch):
                if samples[i].key in skip:
                    continue
                n = samples[i].length
                for layer in layers:
                    unit["states"][layer].append(out[layer][b, :n])
                unit["samples"].append(samples[i])
                unit["tokens"] += n
            batch_tokens = sum(samples[i].length for i in batch)
            remaining -= batch_tokens
            if unit["tokens"] >= (unit_tokens if remaining >= unit_tokens else max(1, unit_tokens // 4)):
                flush()
            if progress is not None:
                progress.advance(len(batch), batch_tokens)
            if timing["first_batch_seconds"] is None:  # one host sync per build: kernel JIT and autotuning
                if cuda:
                    gpus = {t.device for t in out.values()} | {torch.device(device)}
                sync()
                t_first = time.time()
                timing["first_batch_seconds"] = t_first - t0
            else:
                steady["steady_tokens"] += batch_tokens
        sync()
        t_tail = time.time()  # the last forward is done: what follows is the last unit's copy and write
        if t_first is not None:
            steady["steady_seconds"] = t_tail - t_first
        flush()
        bg.close()
        timing["tail_seconds"] = time.time() - t_tail
    finally:
        bg.close()
        cap.close()
        if progress is not None:
            progress.close()
    return {"samples_written": bg.written, "bytes": bg.bytes, "loop_seconds": time.time() - t0,
            "writer_busy_seconds": bg.write_seconds, **timing, **steady, "batch_shapes": len(shapes),
            "pinned_alloc_seconds": (pool.alloc_seconds - alloc0) if pool is not None else 0.0}

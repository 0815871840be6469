"""Page-locked host memory for the capture pipeline: a pool of reused pinned buffers, buffers reserved
ahead of the loop (overlapping the model load), and the asynchronous device-to-host copy of a unit's
states into them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from hsstore.core.quant import Quantized


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

"""Disk helpers of the read benchmarks: drop files from the page cache (cold reads), count their bytes, and
measure the disk's own sequential read rate (a probe file written once, evicted and read in 16 MiB reads)."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROBE_READ = 16 << 20  # the probe's read size


def _files(path: Path) -> list[Path]:
    return [f for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file()]


def evict(path: Path) -> None:
    """Drop ``path`` (a file, or every file under a folder) from the page cache: clean after os.sync,
    so the next read comes from the disk."""
    os.sync()
    for f in _files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def du(path: Path) -> int:
    """Bytes of ``path`` (a file, or every file under a folder)."""
    return sum(f.stat().st_size for f in _files(path))


def write_probe(path: Path, size: int) -> None:
    """A file of ``size`` random bytes on the disk under test (written through, fsync'd)."""
    block = os.urandom(PROBE_READ)
    with open(path, "wb") as f:
        for _ in range(max(1, size // PROBE_READ)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def probe(path: Path) -> float:
    """The disk's sequential read rate (bytes/s): ``path`` evicted, then read once in 16 MiB reads."""
    evict(path)
    buf = bytearray(PROBE_READ)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0, off = time.perf_counter(), 0
        while n := os.preadv(fd, [buf], off):
            off += n
        return off / (time.perf_counter() - t0)
    finally:
        os.close(fd)

"""Disk helpers of the read benchmarks: drop files from the page cache (cold reads) and count their bytes."""

from __future__ import annotations

import os
from pathlib import Path


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

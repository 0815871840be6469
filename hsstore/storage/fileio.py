"""Checked local file writes: every byte reaches the file or the call raises; size and crc32c confirmed.

``os.writev`` may write fewer bytes than asked (a file-size limit, a full disk, a signal): the rest is
written by further calls, and an error on any call raises. The file is fsync'd before it is reported
written, so an error a filesystem reports late (NFS, Lustre, delayed allocation) is seen before the
unit's commit record is, and a commit record never becomes durable ahead of its data. The crc32c is
computed from the buffers as they are handed to the kernel (no second read: docs/benchmarks.md,
"Checked writes").
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

_IOV_MAX = 512  # writev takes a bounded number of buffers


@dataclass(frozen=True)
class Written:
    """What one file holds once written: its size and the crc32c of its bytes (8 hex digits)."""

    size: int
    crc32c: str


def digest(parts: Sequence[Any]) -> Written:
    """Size and crc32c of the concatenation of ``parts`` (bytes-like buffers)."""
    crc, size = 0, 0
    for p in parts:
        crc = crc32c.crc32c(p, crc)
        size += memoryview(p).nbytes
    return Written(size, f"{crc:08x}")


def write_all(fd: int, parts: Sequence[Any]) -> int:
    """Write every byte of ``parts`` to ``fd`` in order; returns the byte count, raises OSError on failure."""
    views = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
    total, i = 0, 0
    while i < len(views):
        batch = views[i : i + _IOV_MAX]
        n = os.writev(fd, batch)
        if n <= 0:
            raise OSError(errno.EIO, "the write made no progress")
        total += n
        for v in batch:  # drop what was written; a short write leaves the rest of a buffer
            if n >= v.nbytes:
                n -= v.nbytes
                i += 1
            else:
                views[i] = v[n:]
                break
    return total


def write_file(path: str, parts: Sequence[Any], exclusive: bool = False, dir_fd: int | None = None) -> Written:
    """Create (or with ``exclusive``, create only if absent) ``path`` (relative to ``dir_fd`` if given)
    holding ``parts``, fsync'd. Never writes through a symlink.

    Raises OSError if any write, the fsync or the close fails, or if the file's size afterwards is not
    the size of ``parts``.
    """
    want = digest(parts)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o644, dir_fd=dir_fd)
    try:
        write_all(fd, parts)
        os.fsync(fd)
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # (its error, e.g. a late NFS write error, raises too)
    if size != want.size:
        raise OSError(errno.EIO, f"the file holds {size} bytes after writing {want.size}")
    return want

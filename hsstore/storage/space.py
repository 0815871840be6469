"""Free space where a store lives: ``statvfs`` of the store's directory, or of its nearest existing parent
when the store is not made yet. Local stores only: an object store (``s3://``...) has no free space to ask."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hsstore.storage.store import is_url


@dataclass(frozen=True)
class FreeSpace:
    """What the filesystem that will hold ``path`` has left for this user; ``block``: its allocation unit."""

    path: str  # the directory asked (the store, or its nearest existing parent)
    free_bytes: int
    block: int


def free_space(location: str) -> FreeSpace | None:
    """Free space for a store at ``location``; None where it is not known: an object store URL, or a
    filesystem that reports no blocks at all (``/proc``, ``/sys``: no store can be made there, and the
    store's own creation names that)."""
    if is_url(location):
        return None
    p = Path(location[len("file://"):] if location.startswith("file://") else location).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    if st.f_blocks == 0:
        return None
    return FreeSpace(str(p), st.f_bavail * st.f_frsize, st.f_frsize or 4096)


def file_size_limit() -> int | None:
    """This process's file-size limit (RLIMIT_FSIZE, ``ulimit -f``) in bytes; None when unlimited. A write past it
    fails (EFBIG) however much space is free."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)

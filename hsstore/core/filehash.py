"""Content hashes of files: xxh3_128 of every byte, streamed, several files in parallel — and no cache.

Every build hashes the model's weight files again. A cache keyed on (path, size, mtime) once let a
changed file keep its old hash (``rsync -a``, ``cp -p`` and re-downloads restore mtimes), so a variant
received states of two different weight files. A key on (device, inode, size, mtime_ns, ctime_ns)
closes the usual ways — a program cannot set ctime — but not all of them: bit rot, network and FUSE
filesystems that report ctime as mtime, a change within one tick of the kernel's coarse file clock
(every stamp stays equal), a restored filesystem snapshot. Hashing needs none of those arguments and
costs little: xxh3 runs at ~10 GB/s per core, so the disk sets the pace (54 GB: see
docs/benchmarks.md, "Weight hashing"), and the bytes read are those the worker loads next, mostly
from the page cache.

A file that changes while it is hashed is refused (its stamp differs before and after), and the
build worker compares the stamps again after loading the model: the hashed bytes are the loaded ones.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from hsstore.core.errors import BuildFailed
from hsstore.core.schema.files import FileStamp, HashedFile

_CHUNK = 16 << 20
MAX_THREADS = 8  # xxhash releases the GIL: threads overlap reads and hashing across files

__all__ = ["FileStamp", "HashedFile", "file_hash", "hash_file", "hash_files", "stamp", "tree_files"]


def stamp(path: str | os.PathLike[str]) -> FileStamp:
    """What the filesystem says about the file behind ``path`` (symlinks followed)."""
    st = os.stat(path)
    return FileStamp(dev=st.st_dev, ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns,
                     ctime_ns=st.st_ctime_ns)


def hash_file(path: str | os.PathLike[str]) -> HashedFile:
    """The file's size, xxh3_128 hex digest and stamp; BuildFailed if it changed while being read."""
    before = stamp(path)
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    after = stamp(path)
    if after != before or size != before.size:
        raise BuildFailed(f"{os.fspath(path)} changed while it was hashed (a copy or download still running?); "
                          "re-run when it is complete")
    return HashedFile(size=size, xxh3_128=h.hexdigest(), stamp=after)


def file_hash(path: str | os.PathLike[str]) -> str:
    """xxh3_128 hex of the file's bytes."""
    return hash_file(path).xxh3_128


def hash_files(paths: Sequence[str | os.PathLike[str]], threads: int | None = None) -> dict[str, HashedFile]:
    """``{str(path): HashedFile}`` for every path, hashed in parallel (up to MAX_THREADS files at once)."""
    n = max(1, min(len(paths), threads or MAX_THREADS))
    with ThreadPoolExecutor(n, thread_name_prefix="hsstore-hash") as pool:
        return dict(zip((str(p) for p in paths), pool.map(hash_file, paths)))


def tree_files(path: str | os.PathLike[str]) -> list[Path]:
    """The regular files under a folder, sorted by relative path (a dataset saved with save_to_disk)."""
    root = Path(path)
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())

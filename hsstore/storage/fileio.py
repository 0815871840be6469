"""Checked local file writes: every byte reaches the file or the call raises; size confirmed, xxh3 recorded;
and the one atomic replace (an fsync'd temporary file renamed over the name) every local writer uses.

``os.writev`` may write fewer bytes than asked (a file-size limit, a full disk, a signal): the rest is
written by further calls, and an error on any call raises. The file is fsync'd before it is reported
written, so an error a filesystem reports late (NFS, Lustre, delayed allocation) is seen before the
unit's commit record is, and a commit record never becomes durable ahead of its data. The checksum (xxh3, 64
bits) is computed from the buffers as they are handed to the kernel (no second read: docs/benchmarks.md,
"Checked writes"). Not crc32c: every chunk and shard index ends with its own crc32c, so a crc32c of a whole shard
file depends only on where those blocks end, and two files of one layout (two layers of a unit) share it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import xxhash

from hsstore.core.errors import WRITE_FIXES, CorruptData, WriteFailed, write_cause
from hsstore.core.nesting import nesting_depth
from hsstore.core.schema.record import explain
from hsstore.core.schema.store_records import CommitRecord, HealthStats, UnitInfo, VariantRecord, WriterInfo

T = TypeVar("T")
_IOV_MAX = 512  # writev takes a bounded number of buffers


@dataclass(frozen=True)
class Written:
    """What one file holds once written: its size and the xxh3 (64-bit) of its bytes (16 hex digits)."""

    size: int
    xxh3: str


def digest(parts: Sequence[Any]) -> Written:
    """Size and xxh3 of the concatenation of ``parts`` (bytes-like buffers)."""
    h, size = xxhash.xxh3_64(), 0
    for p in parts:
        h.update(p)
        size += memoryview(p).nbytes
    return Written(size, h.hexdigest())


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


def install_file(dir_fd: int, name: str, parts: Sequence[Any], tmp: str, replace: bool = True) -> bool:
    """Give ``name`` in the folder ``dir_fd`` the bytes of ``parts`` all at once: they are written to the
    temporary file ``tmp`` beside it (checked, fsync'd, and ``flock``-ed until it is renamed: gc leaves a
    temporary file alone while its writer holds it, hsstore.storage.leases), which is then renamed over
    ``name`` (``replace``) or linked to it only if it is absent (returns False if it exists); the folder is
    fsync'd so the new name outlives a crash. The temporary file never remains. Raises OSError."""
    want = digest(parts)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_all(fd, parts)
        os.fsync(fd)
        if os.fstat(fd).st_size != want.size:
            raise OSError(errno.EIO, f"the file holds {os.fstat(fd).st_size} bytes after writing {want.size}")
        if replace:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            try:  # atomic, fails if the target exists
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                return False
        os.fsync(dir_fd)
        return True
    finally:
        with contextlib.suppress(OSError):  # gone once renamed; any other failure is the error to report
            os.unlink(tmp, dir_fd=dir_fd)
        os.close(fd)


def replace_file(path: str | os.PathLike[str], data: bytes, tmp: str) -> None:
    """Write ``data`` to ``path`` all or nothing (install_file in its folder, through the temporary file
    named ``tmp`` there): a reader sees the old file or the new one. Raises OSError."""
    folder, name = os.path.split(os.fspath(path))
    dfd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        install_file(dfd, name, [data], tmp)
    finally:
        os.close(dfd)


def write_output_file(path: str, data: bytes, option: str) -> None:
    """Write ``data`` to the file the user named with ``option`` (``--json FILE``, ``--plot PNG``): replaced
    all or nothing (replace_file), or streamed into a FIFO, a device or ``/dev/stdout`` (core.outputs); a link
    hsstore does not write through is refused (exit 2), a failing write (a full disk, a file-size limit) is
    one line, exit 1."""
    from hsstore.core.outputs import streamed

    p = os.path.expanduser(path)
    try:
        if streamed(p):
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)  # after what the shell's redirection holds
            try:
                write_all(fd, [data])
            finally:
                os.close(fd)
        else:
            replace_file(p, data, f".{os.path.basename(p)}.{uuid.uuid4().hex[:12]}.tmp")
    except OSError as e:
        fix = WRITE_FIXES[write_cause(e)].rstrip(",")
        raise WriteFailed(
            f"writing {option} {path!r} failed: {e.strerror or e}; {fix[0].lower()}{fix[1:]}, or write it elsewhere"
        ) from None


# --- Reading and writing a store's JSON metadata: bounded parsing, zarr group documents, the typed records.

__all__ = [
    "MAX_DEPTH",
    "MAX_RECORD_BYTES",
    "CommitRecord",
    "HealthStats",
    "UnitInfo",
    "VariantRecord",
    "WriterInfo",
    "convert_strict",
    "group_json",
    "parse_json",
]

# the largest metadata file hsstore writes is a commit record: ~50 bytes per sample, so a unit of
# 100,000 short samples is ~5 MB; 64 MiB leaves room and still bounds what a reader takes in
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 32  # deepest hsstore writes: provenance, about 6 levels


def group_json(attributes: dict[str, Any]) -> bytes:
    """zarr v3 group metadata carrying ``attributes``, so any zarr reader opens the hierarchy."""
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes}, indent=1).encode()


def parse_json(data: bytes, what: str) -> Any:
    """JSON only (never pickle), nested at most ``MAX_DEPTH`` deep; a one-line CorruptData naming ``what``."""
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError) as e:
        raise CorruptData(f"{what} is not valid JSON ({str(e)[:120]}); run `hsstore verify`") from None
    if nesting_depth(value, stop=MAX_DEPTH) > MAX_DEPTH:
        raise CorruptData(f"{what} nests deeper than {MAX_DEPTH} levels; hsstore never writes that")
    return value


def convert_strict(value: Any, type_: type[T], what: str) -> T:
    """Parsed JSON ``value`` as ``type_`` (a zarr document: unknown keys allowed, known ones typed strictly);
    a one-line CorruptData naming ``what`` and the offending key otherwise."""
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as e:
        raise CorruptData(f"{what}: {explain(e, value)}") from None

"""Unit leases: the one rule for who may touch a unit of a local store (docs/concurrency.md).

A writer claims a unit by making its folder *with* its writer record already inside, locked: the folder
is built under a temporary name (``units/.tmp-…/zarr.json``, ``flock``-ed) and renamed into place, so
``units/<uid>`` never exists without a record, and the record stays locked until the writer has
committed (or dies: the kernel drops a dead process's locks). gc removes an uncommitted unit only while
holding that lock itself, so a unit whose writer still runs is never removed, whatever ``--force`` or
``--grace`` say. Object stores have no locks: there the writer's pid, host and age still decide.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
import uuid

from hsstore.storage.fileio import write_all

FRESH_SECONDS = 5.0  # an empty file this young may be one its writer has created and not yet locked
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Lease:
    """Held while a unit may not be removed by anyone else; ``release`` (or the process's end) ends it."""

    def __init__(self, fd: int = -1) -> None:
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor drops its flock
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit; the kernel drops the lock with the process
            pass


def claim(units_fd: int, uid: str, record_name: str, data: bytes, tmp_prefix: str) -> Lease | None:
    """Create folder ``uid`` in the folder ``units_fd`` holding ``record_name`` = ``data``, locked, in one
    step (a locked temporary folder renamed into place). None if ``uid`` exists already. Raises OSError."""
    tmp = f"{tmp_prefix}{uuid.uuid4().hex}"
    os.mkdir(tmp, 0o755, dir_fd=units_fd)
    fd = -1
    try:
        dfd = os.open(tmp, _DIR_FLAGS, dir_fd=units_fd)
        try:
            fd = os.open(
                record_name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
            write_all(fd, [data])
            os.fsync(fd)
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if exists(units_fd, uid):
            raise FileExistsError(errno.EEXIST, uid)
        os.rename(tmp, uid, src_dir_fd=units_fd, dst_dir_fd=units_fd)  # fails if uid holds anything
        os.fsync(units_fd)
        return Lease(fd)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        _remove_quietly(units_fd, tmp)
        if isinstance(e, FileExistsError) or e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return None
        raise


def take_if_free(dir_fd: int, name: str) -> Lease | None:
    """The lock of file ``name`` in the folder ``dir_fd`` (a unit's writer record, a temporary file) if no
    live process holds it (None while one does, or while it is an empty file younger than
    ``FRESH_SECONDS``: its writer is between creating and locking it). A missing file gets an empty lease:
    nothing guards it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return Lease()
    lease = _try_flock(fd, fcntl.LOCK_EX)  # on a file system without flock the writer record's pid and age decide
    if lease is None or lease.fd < 0:
        return lease
    st = os.fstat(fd)
    if st.st_size == 0 and time.time() - st.st_mtime < FRESH_SECONDS:
        lease.release()
        return None
    return lease


def exists(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is an entry of the folder ``dir_fd`` (a link is not followed)."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _remove_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(name, dir_fd=dir_fd)


def hold_folder(path: str) -> Lease:
    """A shared lock on folder ``path`` (a local store), held while this process writes into it: a command
    that made the store removes it on failure only while no one else holds it (``take_folder_alone``).
    A folder removed by such a command while this call waited is made again. Raises OSError."""
    for _ in range(3):
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            return Lease(fd)  # a file system without flock: nothing to hold
        if os.fstat(fd).st_nlink > 0:
            return Lease(fd)
        os.close(fd)  # removed while we waited for the lock
    raise OSError(errno.ENOENT, f"{path} keeps being removed by another command")


def take_folder_alone(held: Lease) -> bool:
    """Turn the shared lock ``held`` into an exclusive one if no other process holds the folder."""
    if held.fd < 0:
        return False
    try:
        fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def lock_folder_alone(path: str) -> Lease | None:
    """An exclusive lock on the existing folder ``path`` (an export folder while an export writes it), or
    None while another process holds any lock on it (an export writing, an import reading it). Raises OSError
    if the folder cannot be opened."""
    fd = os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        return None if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else Lease()
    return Lease(fd)


def _try_flock(fd: int, mode: int) -> Lease | None:
    """``fd`` locked in ``mode`` without waiting: its lease, None while another process holds it, an empty
    lease where the file system has no flock (``fd`` is closed in both of those cases)."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        return None if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else Lease()
    return Lease(fd)


def share_folder(path: str) -> Lease | None:
    """A shared lock on the existing folder ``path`` (an import reading an export folder), or None while a
    process holds it exclusively (an export writing it). A folder that cannot be opened or locked gets an
    empty lease (its reader names what is wrong with it)."""
    try:
        fd = os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return Lease()
    return _try_flock(fd, fcntl.LOCK_SH)

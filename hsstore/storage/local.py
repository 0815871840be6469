"""The local-directory back end: checked writes (storage.fileio), reads and removals that never follow a
symlink or leave the root (storage.localfs), atomic puts by rename or link of an fsync'd temp file."""

from __future__ import annotations

import functools
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from hsstore.core.errors import CorruptData, WriteFailed, write_cause
from hsstore.storage import leases, localfs
from hsstore.storage.backend import Backend, Entry, RangeSource
from hsstore.storage.fileio import Written, install_file, write_file
from hsstore.storage.layout import META, TMP_PREFIX
from hsstore.storage.metadata_io import MAX_RECORD_BYTES

T = TypeVar("T")
DEFAULT_READAHEAD = 128 << 10  # Linux's default readahead window, where a device's cannot be read


@functools.lru_cache(maxsize=64)
def readahead_window(dev: int) -> int:
    """Bytes of readahead window of the device ``dev`` (``st_dev``) a file lives on: its
    ``/sys/class/bdi/MAJ:MIN/read_ahead_kb`` (``DEFAULT_READAHEAD`` where there is none to read)."""
    try:
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb") as f:
            return max(DEFAULT_READAHEAD, int(f.read().strip()) << 10)
    except (OSError, ValueError):
        return DEFAULT_READAHEAD


def write_failed(key: str, e: BaseException) -> WriteFailed:
    """One line naming the key and the operating system's reason."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
    return WriteFailed(f"writing {key} failed: {why}", write_cause(e))


def _is_claim_folder(key: str) -> bool:
    """Whether ``key`` is where leases.claim builds a unit folder (``variants/<vid>/units/.tmp-…``)."""
    parts = key.split("/")
    return len(parts) == 4 and parts[0] == "variants" and parts[2] == "units"


class LocalRange(RangeSource):
    """``pread``/``preadv`` on one open regular file."""

    def __init__(self, fd: int, key: str) -> None:
        self.fd, self.key = fd, key
        st = os.fstat(fd)
        self.size, self.step = st.st_size, readahead_window(st.st_dev)

    def read(self, offset: int, n: int) -> bytes:
        with localfs.reading(self.key):
            return os.pread(self.fd, n, offset)

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        with localfs.reading(self.key):
            return os.preadv(self.fd, list(views), offset)

    def cached(self, offset: int, n: int) -> bool:
        """Whether the first and the last page of the range are in the page cache (``RWF_NOWAIT`` reads)."""
        flag = getattr(os, "RWF_NOWAIT", None)
        if flag is None or self.fd < 0 or n <= 0:
            return False
        probe = bytearray(1)
        try:
            return all(os.preadv(self.fd, [probe], at, flag) == 1 for at in (offset, offset + n - 1))
        except OSError:  # EAGAIN: not in memory (or the kernel cannot say)
            return False

    def will_need(self, offset: int, n: int) -> None:
        """Ask the kernel to read ``[offset, offset + n)`` in the background, in steps of the device's
        readahead window: Linux reads at most that much of one WILLNEED and drops the rest (one 64 MiB
        WILLNEED brought 8 MiB in with ``read_ahead_kb`` 8192)."""
        if self.fd < 0 or not hasattr(os, "posix_fadvise"):
            return
        for at in range(offset, offset + n, self.step):
            os.posix_fadvise(self.fd, at, min(self.step, offset + n - at), os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class LocalBackend(Backend):
    """A store in a local directory."""

    is_local = True

    def __init__(self, path: str) -> None:
        self.location = path
        self.root = os.path.realpath(path)  # a link to the store is the user's choice; nothing inside is followed

    def get(self, key: str, cap: int | None = None) -> bytes | None:
        with localfs.reading(key):
            return localfs.read_file(self.root, key, MAX_RECORD_BYTES if cap is None else cap)

    def _in_dir(self, key: str, folder: str, write: Callable[[int], T]) -> T:
        """``write(fd of folder)``, the folder made if missing; any failure is ``key``'s WriteFailed."""
        try:
            dfd = localfs.open_dir(self.root, folder, create=True)
            try:
                return write(dfd)
            finally:
                os.close(dfd)
        except (OSError, CorruptData) as e:
            raise write_failed(key, e) from None

    def put(self, key: str, parts: Sequence[Any]) -> Written:
        head, _, name = key.rpartition("/")
        return self._in_dir(key, head, lambda dfd: write_file(name, parts, dir_fd=dfd))

    def put_atomic(self, key: str, data: bytes) -> None:
        self._put_via_temp(key, data, replace=True)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._put_via_temp(key, data, replace=False)

    def _put_via_temp(self, key: str, data: bytes, replace: bool) -> bool:
        """An fsync'd temporary file, then renamed over (``replace``) or linked to (if absent) ``key``."""
        head, _, name = key.rpartition("/")
        return self._in_dir(key, head, lambda dfd: install_file(dfd, name, [data], f"{TMP_PREFIX}{uuid.uuid4().hex}",
                                                                 replace))

    def claim(self, key: str, data: bytes) -> leases.Lease | None:
        head, _, name = key.rpartition("/")
        parent, _, uid = head.rpartition("/")
        return self._in_dir(key, parent, lambda pfd: leases.claim(pfd, uid, name, data, TMP_PREFIX))

    def lease_if_free(self, key: str) -> leases.Lease | None:
        """(A folder's lease is its writer record's: a unit folder being claimed.)"""
        head, _, name = key.rpartition("/")
        try:
            dfd = localfs.open_dir(self.root, head)
        except (OSError, CorruptData):
            return leases.Lease()  # no unit folder (or not one): nothing to guard
        try:
            try:
                sub = localfs.open_dir(self.root, key)
            except (OSError, CorruptData):
                return leases.take_if_free(dfd, name)
            try:
                if not leases.exists(sub, META) and time.time() - os.fstat(sub).st_mtime < leases.FRESH_SECONDS:
                    return None  # a claim folder whose claimer has not made its record yet
                return leases.take_if_free(sub, META)
            finally:
                os.close(sub)
        finally:
            os.close(dfd)

    def open_range(self, key: str) -> LocalRange:
        with localfs.reading(key):
            return LocalRange(localfs.open_file(self.root, key), key)

    def list(self, prefix: str) -> list[str]:
        base = prefix.rstrip("/")
        with localfs.reading(base):
            return sorted(k for k, st in localfs.walk(self.root, base)
                          if not stat.S_ISDIR(st.st_mode) and not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX))

    def list_dir(self, prefix: str) -> list[str]:
        with localfs.reading(prefix):
            return [name for name, _ in localfs.entries(self.root, prefix.rstrip("/"))]

    def entries(self) -> Iterator[Entry]:
        with localfs.reading(""):
            found = list(localfs.walk(self.root))
        for key, st in found:
            kind = localfs.kind_of(st.st_mode)
            yield Entry(key, kind, kind == "file" and bool(st.st_mode & 0o111))

    def size(self, key: str) -> int | None:
        with localfs.reading(key):
            try:
                fd = localfs.open_file(self.root, key)
            except FileNotFoundError:
                return None
            try:
                return os.fstat(fd).st_size
            finally:
                os.close(fd)

    def crc32c(self, key: str) -> str | None:
        try:
            src = self.open_range(key)
        except FileNotFoundError:
            return None
        try:
            return src.crc32c()
        finally:
            src.close()

    def remove_tree(self, prefix: str) -> int:
        try:
            return localfs.remove_tree(self.root, prefix.rstrip("/"))
        except FileNotFoundError:
            return 0

    def remove(self, key: str) -> None:
        try:
            localfs.remove_file(self.root, key)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # a unit folder whose claim never finished (leases.claim)
            self.remove_tree(key)

    def temp_files(self) -> list[tuple[str, float]]:
        now = time.time()
        return [(k, now - st.st_mtime) for k, st in localfs.walk(self.root)
                if k.rsplit("/", 1)[-1].startswith(TMP_PREFIX)
                and (stat.S_ISREG(st.st_mode) or (stat.S_ISDIR(st.st_mode) and _is_claim_folder(k)))]

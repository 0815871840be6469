"""The local-directory back end: checked writes (storage.fileio), reads and removals that never follow a
symlink or leave the root (storage.localfs), atomic puts by rename or link of an fsync'd temp file."""

from __future__ import annotations

import builtins
import errno
import functools
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from hsstore.core.errors import BadInput, CorruptData, WriteFailed, write_cause
from hsstore.storage import leases
from hsstore.storage.backend import Backend, Entry, EntryKind, RangeSource
from hsstore.storage.fileio import MAX_RECORD_BYTES, Written, install_file, write_file
from hsstore.storage.layout import META, TMP_PREFIX

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from hsstore.core.schema.store_records import ChecksumKind

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
        with reading(self.key):
            return os.pread(self.fd, n, offset)

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        with reading(self.key):
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
        with reading(key):
            return read_file(self.root, key, MAX_RECORD_BYTES if cap is None else cap)

    def _in_dir(self, key: str, folder: str, write: Callable[[int], T]) -> T:
        """``write(fd of folder)``, the folder made if missing; any failure is ``key``'s WriteFailed."""
        try:
            dfd = open_dir(self.root, folder, create=True)
            try:
                return write(dfd)
            finally:
                os.close(dfd)
        except (OSError, CorruptData) as e:
            raise write_failed(key, e) from None

    def put(self, key: str, parts: Sequence[Buffer]) -> Written:
        head, _, name = key.rpartition("/")
        return self._in_dir(key, head, lambda dfd: write_file(name, parts, dir_fd=dfd))

    def put_atomic(self, key: str, data: bytes) -> None:
        self._put_via_temp(key, data, replace=True)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._put_via_temp(key, data, replace=False)

    def _put_via_temp(self, key: str, data: bytes, replace: bool) -> bool:
        """An fsync'd temporary file, then renamed over (``replace``) or linked to (if absent) ``key``."""
        head, _, name = key.rpartition("/")
        return self._in_dir(
            key, head, lambda dfd: install_file(dfd, name, [data], f"{TMP_PREFIX}{uuid.uuid4().hex}", replace)
        )

    def claim(self, key: str, data: bytes) -> leases.Lease | None:
        head, _, name = key.rpartition("/")
        parent, _, uid = head.rpartition("/")
        return self._in_dir(key, parent, lambda pfd: leases.claim(pfd, uid, name, data, TMP_PREFIX))

    def lease_if_free(self, key: str) -> leases.Lease | None:
        """(A folder's lease is its writer record's: a unit folder being claimed.)"""
        head, _, name = key.rpartition("/")
        try:
            dfd = open_dir(self.root, head)
        except (OSError, CorruptData):
            return leases.Lease()  # no unit folder (or not one): nothing to guard
        try:
            try:
                sub = open_dir(self.root, key)
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
        with reading(key):
            return LocalRange(open_file(self.root, key), key)

    def list(self, prefix: str) -> builtins.list[str]:
        base = prefix.rstrip("/")
        with reading(base):
            return sorted(
                k
                for k, st in walk(self.root, base)
                if not stat.S_ISDIR(st.st_mode) and not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX)
            )

    def list_dir(self, prefix: str) -> builtins.list[str]:
        with reading(prefix):
            return [name for name, _ in entries(self.root, prefix.rstrip("/"))]

    def entries(self) -> Iterator[Entry]:
        with reading(""):
            found = list(walk(self.root))
        for key, st in found:
            kind = kind_of(st.st_mode)
            yield Entry(key, kind, kind == "file" and bool(st.st_mode & 0o111))

    def size(self, key: str) -> int | None:
        with reading(key):
            try:
                fd = open_file(self.root, key)
            except FileNotFoundError:
                return None
            try:
                return os.fstat(fd).st_size
            finally:
                os.close(fd)

    def checksum(self, key: str, kind: ChecksumKind) -> str | None:
        try:
            src = self.open_range(key)
        except FileNotFoundError:
            return None
        try:
            return src.checksum(kind)
        finally:
            src.close()

    def remove_tree(self, prefix: str) -> int:
        try:
            return remove_tree(self.root, prefix.rstrip("/"))
        except FileNotFoundError:
            return 0

    def remove(self, key: str) -> None:
        try:
            remove_file(self.root, key)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # a unit folder whose claim never finished (leases.claim)
            self.remove_tree(key)

    def temp_files(self) -> builtins.list[tuple[str, float]]:
        now = time.time()
        return [
            (k, now - st.st_mtime)
            for k, st in walk(self.root)
            if k.rsplit("/", 1)[-1].startswith(TMP_PREFIX)
            and (stat.S_ISREG(st.st_mode) or (stat.S_ISDIR(st.st_mode) and _is_claim_folder(k)))
        ]


# --- Local filesystem access that never follows a symlink, never leaves the store's root, never blocks.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(CorruptData):
    """A path inside the store that is a symlink, or not the kind of entry the format puts there."""


@contextmanager
def reading(key: str) -> Iterator[None]:
    """Operating-system errors of a read as hsstore's one-line errors (a missing file stays
    FileNotFoundError: callers decide what absence means)."""
    try:
        yield
    except (FileNotFoundError, CorruptData):
        raise
    except PermissionError:
        raise BadInput(f"cannot read {key or 'the store'}: permission denied; check the store's permissions") from None
    except OSError as e:
        raise CorruptData(f"reading {key or 'the store'} failed: {e.strerror or e}") from None


# each kind of entry: (its test, its name in Entry.kind, how an error names it)
_KINDS: tuple[tuple[Callable[[int], bool], EntryKind, str], ...] = (
    (stat.S_ISREG, "file", "a regular file"),
    (stat.S_ISDIR, "dir", "a directory"),
    (stat.S_ISLNK, "symlink", "a symlink"),
    (stat.S_ISFIFO, "fifo", "a FIFO"),
    (stat.S_ISSOCK, "socket", "a socket"),
    (stat.S_ISCHR, "device", "a character device"),
    (stat.S_ISBLK, "device", "a block device"),
)


def _kind(mode: int) -> str:
    return next((words for test, _, words in _KINDS if test(mode)), "a special file")


def open_dir(root: str, key: str, create: bool = False) -> int:
    """A descriptor of directory ``root/key`` reached without following any symlink (caller closes it),
    made if missing with ``create``. FileNotFoundError if a component is missing; UnsafePath if one is a
    symlink or not a directory."""
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the root itself may be a symlink the user chose
    try:
        for part in [p for p in key.split("/") if p]:
            if part in (".", ".."):
                raise UnsafePath(f"{key!r} leaves the store")
            nxt = _open_child(fd, part, key, create)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(fd: int, part: str, key: str, create: bool) -> int:
    for attempt in (0, 1):
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create or attempt:
                raise
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass  # a racing writer made it
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            mode = os.lstat(part, dir_fd=fd).st_mode
            if e.errno == errno.ENOTDIR and not create:  # nothing lies under a file (as on object stores)
                raise FileNotFoundError(errno.ENOENT, f"{key}: {part} is {_kind(mode)}") from None
            raise UnsafePath(f"{key}: {part} is {_kind(mode)}, where the format has a directory") from None
    raise AssertionError("unreachable")


def kind_of(mode: int) -> EntryKind:
    """``file``, ``dir``, ``symlink``, ``fifo``, ``socket``, ``device`` or ``other``."""
    return next((kind for test, kind, _ in _KINDS if test(mode)), "other")


def open_file(root: str, key: str) -> int:
    """A read descriptor of regular file ``root/key`` (FileNotFoundError if missing), never blocking
    (a FIFO opens and is refused), never through a symlink."""
    head, _, name = key.rpartition("/")
    dfd = open_dir(root, head)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UnsafePath(f"{key} is a symlink; hsstore writes only regular files") from None
    finally:
        os.close(dfd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafePath(f"{key} is {_kind(mode)}; hsstore writes only regular files")
    return fd


def read_file(root: str, key: str, cap: int) -> bytes | None:
    """The bytes of regular file ``root/key`` (None if missing), at most ``cap`` bytes, never blocking."""
    try:
        fd = open_file(root, key)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise CorruptData(f"{key} holds {size} bytes, more than the {cap} a record of this kind may hold")
        data = b""
        while len(data) <= cap and (more := os.read(fd, cap + 1 - len(data))):
            data += more
        if len(data) > cap:
            raise CorruptData(f"{key} grew past {cap} bytes while being read")
        return data
    finally:
        os.close(fd)


def entries(root: str, key: str) -> list[tuple[str, int]]:
    """``(name, st_mode)`` of each entry of directory ``root/key`` (lstat: links are not followed);
    [] if it does not exist."""
    try:
        fd = open_dir(root, key)
    except FileNotFoundError:
        return []
    try:
        out = []
        for name in os.listdir(fd):
            try:
                out.append((name, os.lstat(name, dir_fd=fd).st_mode))
            except FileNotFoundError:
                continue  # removed while listing
        return sorted(out)
    finally:
        os.close(fd)


def walk(root: str, key: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """``(key, lstat)`` of every entry under ``root/key`` (directories too), never following a symlink."""
    try:
        top = open_dir(root, key)
    except FileNotFoundError:
        return
    try:
        for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            rel = os.path.normpath(os.path.join(key, dirpath)).replace(os.sep, "/")
            for name in dirnames + filenames:
                try:
                    yield (name if rel == "." else f"{rel}/{name}"), os.lstat(name, dir_fd=dfd)
                except FileNotFoundError:
                    continue
    finally:
        os.close(top)


def remove_tree(root: str, key: str) -> int:
    """Remove directory ``root/key`` and everything in it; returns how many entries other than directories
    it held. Never follows a symlink (shutil.rmtree with a directory descriptor: a link inside is removed
    as a link, its target untouched); UnsafePath if ``key`` itself is not a directory."""
    head, _, name = key.rstrip("/").rpartition("/")
    dfd = open_dir(root, head)
    try:
        mode = os.lstat(name, dir_fd=dfd).st_mode
        if not stat.S_ISDIR(mode):
            raise UnsafePath(f"{key} is {_kind(mode)}, not a directory; not removed")
        top = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        try:
            n = 0
            for _, dirs, files, sub in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                n += len(files) + sum(1 for d in dirs if stat.S_ISLNK(os.lstat(d, dir_fd=sub).st_mode))
        finally:
            os.close(top)
        shutil.rmtree(name, dir_fd=dfd)
        return n
    finally:
        os.close(dfd)


def remove_file(root: str, key: str) -> None:
    """Unlink ``root/key`` (a link itself, never its target)."""
    head, _, name = key.rpartition("/")
    dfd = open_dir(root, head)
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)

"""Local filesystem access that never follows a symlink, never leaves the store's root, never blocks.

Every path is walked from the root one component at a time with ``O_NOFOLLOW`` directory descriptors,
so a symlink anywhere inside the store (``variants/x -> /elsewhere``) stops the walk instead of leading
out of it. Files are opened ``O_NONBLOCK | O_NOFOLLOW`` and must be regular files (a FIFO, socket or
device never hangs or floods a reader); reads are capped.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from hsstore.core.errors import BadInput, CorruptData

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
_KINDS = ((stat.S_ISREG, "file", "a regular file"), (stat.S_ISDIR, "dir", "a directory"),
          (stat.S_ISLNK, "symlink", "a symlink"), (stat.S_ISFIFO, "fifo", "a FIFO"),
          (stat.S_ISSOCK, "socket", "a socket"), (stat.S_ISCHR, "device", "a character device"),
          (stat.S_ISBLK, "device", "a block device"))


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


def kind_of(mode: int) -> str:
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

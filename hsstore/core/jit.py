"""Loops compiled at first use, whose machine code is cached on disk where it can be: C through the host's compiler
(``native_library``), or numba's (``JitLoops``).

C (the diff's loops, ``hsstore/compare/kernel.c``): the host's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``)
builds a shared library for this CPU (``-march=native``) once, in a private folder, then copies it into
``$HSSTORE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/hsstore`` or ``~/.cache/hsstore``) under ``native/``, named by a hash
of the source, the flags and the CPU, with its own hash beside it; later processes read it, check it against the hash and load those very bytes
(through an in-memory file on Linux) in ~1 ms. A cache folder or file that is not this user's alone, or a library that does not match its hash, is
never loaded (built again instead). Where no compiler builds a library that loads, ``NativeUnavailable`` says why and
the caller takes its torch path.

numba compiles a function at its first call and saves the machine code beside the source (or in
``NUMBA_CACHE_DIR``). A read-only install raises RuntimeError when a function is wrapped; a save that fails
(a full disk, a file-size limit, a folder made read-only since) raises OSError from the first call, before
the loop runs. Either way the command should run, only slower to start: ``JitLoops`` compiles again
without the cache and calls again.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsstore.core.interrupt import ForkSafeLock


class JitLoops:
    """The loops ``compile(cache)`` returns (name -> compiled function; ``cache``: save machine code on disk),
    called by name."""

    def __init__(self, compile: Callable[[bool], dict[str, Callable[..., Any]]]) -> None:
        self._compile, self._lock = compile, ForkSafeLock()
        try:
            self._loops, self._cached = compile(True), True
        except RuntimeError:  # no writable cache folder
            self._loops, self._cached = compile(False), False

    def __call__(self, name: str, *args: Any) -> Any:
        loops = self._loops
        try:
            return loops[name](*args)
        except OSError:  # the machine code could not be saved (nothing ran): compile in this process
            with self._lock:
                if self._cached:
                    self._loops, self._cached = self._compile(False), False
            if loops is self._loops:
                raise
            return self._loops[name](*args)


class NativeUnavailable(RuntimeError):
    """No C library could be built or loaded (no compiler, a failed build, a library that does not load): the
    message says which and why."""


# -march=native: the vector loops use the widest registers this CPU has (only where the CPU's features are known and
# key the cache); no fast-math: IEEE rounding, NaNs and infinities kept, fused multiply-adds allowed (a source that
# must round a product on its own says so)
_FLAGS = ("-O3", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC")
_TUNED = ("-march=native",)
COMPILE_SECONDS = 60


def _compiler() -> list[str]:
    """The compiler's command: ``$CC`` (split as a shell would: ``ccache gcc``), else the first of cc, gcc, clang."""
    cc = os.environ.get("CC")
    if cc:
        try:
            argv = shlex.split(cc)
        except ValueError as e:
            raise NativeUnavailable(f"$CC={cc!r} does not parse as a command ({e})") from None
        found = shutil.which(argv[0]) if argv else None
        if not found:
            raise NativeUnavailable(f"$CC={cc!r} is not a command here (unset CC to use cc, gcc or clang)")
        return [found, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    raise NativeUnavailable("no C compiler found ($CC, cc, gcc, clang)")


def _cpu() -> str | None:
    """This CPU's architecture and feature flags (Linux's /proc/cpuinfo), which code tuned for it depends on; None
    where they are not known (only plain builds are made and cached there)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.strip() for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return None
    return f"{platform.machine()} {flags}" if flags else None


def _builds() -> list[tuple[str, ...]]:
    """The flag sets a library may be built with here, best first."""
    return [(*_FLAGS, *_TUNED), _FLAGS] if _cpu() else [_FLAGS]


def cache_dir() -> Path:
    """Where compiled libraries are kept: ``$HSSTORE_CACHE_DIR``, ``$XDG_CACHE_HOME/hsstore`` or ``~/.cache/hsstore``
    (``~`` expanded, made absolute)."""
    root = os.environ.get("HSSTORE_CACHE_DIR")
    try:
        if root:
            return Path(root).expanduser().absolute()
        return (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hsstore").expanduser().absolute()
    except RuntimeError as e:  # no HOME and no passwd entry (cron, env -i)
        raise NativeUnavailable(f"no cache folder: {e} (set HSSTORE_CACHE_DIR)") from None


def library_path(source: Path, flags: tuple[str, ...] | None = None) -> Path:
    """Where the library built from ``source`` with ``flags`` (default: the best for this host) is cached: named by a
    hash of the source, the flags and, for a tuned build, the CPU (not the compiler: a library any compiler built
    serves, even on a host that has none). Its xxh64 is kept beside it (``.xxh64``)."""
    import xxhash

    flags = flags or _builds()[0]
    where = _cpu() if _TUNED[0] in flags else platform.machine()
    key = xxhash.xxh64(b"\0".join([source.read_bytes(), " ".join(flags).encode(), str(where).encode()]))
    return cache_dir() / "native" / f"{source.stem}-{key.hexdigest()}.so"


def _ours(path: Path) -> bool:
    """Whether ``path`` belongs to this user and no one else may write it (a library loaded from there runs as us)."""
    if not hasattr(os, "geteuid"):
        return True
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _digest(data: bytes) -> str:
    import xxhash

    return xxhash.xxh64(data).hexdigest()


def _read_ours(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (not a symlink), checked on the open file to be ours alone: what is
    read is what was checked, whatever is renamed meanwhile. OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (
            hasattr(os, "geteuid") and (st.st_uid != os.geteuid() or st.st_mode & 0o022)
        ):
            raise PermissionError(f"{path} is not this user's alone")
        return f.read()


def _load(data: bytes, name: str) -> ctypes.CDLL:
    """A shared library from its bytes: through an anonymous in-memory file on Linux (the very bytes checked, on no
    mount that may forbid executing), else from a private temporary file. OSError if it does not load."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name)
        try:
            os.write(fd, data)
            # the descriptor stays open: the loader knows a library by its path, and a number closed and reused
            # would hand a later library this one's handle
            return ctypes.CDLL(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            raise
    with tempfile.TemporaryDirectory(prefix="hsstore-native-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        return ctypes.CDLL(str(path))


def _load_cached(lib: Path) -> ctypes.CDLL | None:
    """The cached library, if it is whole (its bytes match the hash beside it: a file cut short by a crash would
    kill the process that maps it) and both files are ours alone; else None."""
    try:
        if not _ours(lib.parent):
            return None
        data, want = _read_ours(lib), _read_ours(lib.with_name(lib.name + ".xxh64")).strip()
        if _digest(data).encode() != want:
            return None
        return _load(data, lib.name)
    except OSError:
        return None


def _build(cc: list[str], source: Path, out: Path) -> tuple[str, ...]:
    """Compile ``source`` into the shared library ``out`` with the best flags that work here; the flags."""
    errors: list[str] = []
    for flags in _builds():
        try:
            with subprocess.Popen(
                [*cc, *flags, "-o", str(out), str(source)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            ) as p:
                try:
                    _, err = p.communicate(timeout=COMPILE_SECONDS)
                except subprocess.TimeoutExpired:  # (its own session: the compiler's children go too)
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
                    raise NativeUnavailable(f"{cc[0]} did not compile {source.name} in {COMPILE_SECONDS} s") from None
        except OSError as e:
            raise NativeUnavailable(f"{cc[0]} did not run: {e}") from None
        if p.returncode == 0 and out.is_file():
            return flags
        lines = err.strip().splitlines()
        said = [line for line in lines if "error" in line.lower()]  # (gcc's last line may be where to report bugs)
        errors.append((said[:1] or lines[-1:] or [f"exit {p.returncode} and no library written"])[0])
    raise NativeUnavailable(f"{cc[0]} could not compile {source.name}: {errors[-1]}")


def _publish(built: Path, lib: Path) -> bool:
    """Copy ``built`` into the cache as ``lib``, then its hash beside it, each written whole (fsynced, renamed into
    place); False where the cache folder cannot be written or is not ours alone."""
    try:
        lib.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _ours(lib.parent):
            return False
        data = built.read_bytes()
        for path, content in ((lib, data), (lib.with_name(lib.name + ".xxh64"), _digest(data).encode())):
            fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        return True
    except OSError:
        return False


def native_library(source: Path) -> ctypes.CDLL:
    """``source`` (C) as a loaded shared library: from the cache when built before, else compiled now (in a private
    folder, then copied into the cache where it can be). NativeUnavailable where neither works."""
    if not source.is_file():
        raise NativeUnavailable(f"{source} is missing from this install (reinstall hsstore)")
    for flags in _builds():  # (a plain build is cached where a tuned one failed: not tried again)
        loaded = _load_cached(library_path(source, flags))
        if loaded is not None:
            return loaded
    cc = _compiler()
    with tempfile.TemporaryDirectory(prefix="hsstore-native-") as tmp:
        private = Path(tmp) / f"{source.stem}.so"
        lib = library_path(source, _build(cc, source, private))
        _publish(private, lib)
        try:
            return _load(private.read_bytes(), lib.name)
        except OSError as e:
            raise NativeUnavailable(f"{source.name} was built but does not load: {e}") from None

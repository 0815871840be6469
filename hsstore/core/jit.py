"""Loops compiled at first use, whose machine code is cached on disk where it can be: C through the host's compiler
(``native_library``), or numba's (``JitLoops``).

C (the diff's loops, ``hsstore/compare/kernel.c``): the host's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``)
builds a shared library for this CPU (``-march=native``) once, into ``$HSSTORE_CACHE_DIR`` (default
``$XDG_CACHE_HOME/hsstore`` or ``~/.cache/hsstore``) under ``native/``, named by a hash of the source, the flags and
the CPU, and renamed into place whole; later processes load it through ctypes in ~1 ms. Where that folder cannot be
written, the library is built in a temporary folder for the process. Where no compiler works, ``NativeUnavailable``
says why and the caller takes its torch path.

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
import shutil
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
    """No C compiler built the library (none found, or each attempt failed): the message says which and why."""


# -march=native: the vector loops use the widest registers this CPU has; no fast-math: IEEE rounding, NaNs and
# infinities kept, fused multiply-adds allowed (a source that must round a product on its own says so)
_FLAGS = ("-O3", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC")
_TUNED = ("-march=native",)


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise NativeUnavailable("no C compiler found ($CC, cc, gcc, clang)")


def _cpu() -> str:
    """What the machine code depends on: the architecture and, on Linux, the CPU's feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = platform.processor()
    return f"{platform.machine()} {flags.strip()}"


def cache_dir() -> Path:
    """Where compiled libraries are kept: ``$HSSTORE_CACHE_DIR``, ``$XDG_CACHE_HOME/hsstore`` or ``~/.cache/hsstore``."""
    root = os.environ.get("HSSTORE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hsstore"


def _build(cc: str, source: Path, out: Path) -> None:
    """Compile ``source`` into the shared library ``out`` (tuned for this CPU, else plain); NativeUnavailable if neither."""
    errors = []
    for flags in ((*_FLAGS, *_TUNED), _FLAGS):
        try:
            r = subprocess.run([cc, *flags, "-o", str(out), str(source)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeUnavailable(f"{cc} did not run: {e}") from None
        if r.returncode == 0:
            return
        errors.append(r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"])
    raise NativeUnavailable(f"{cc} could not compile {source.name}: {errors[-1][0]}")


def library_path(source: Path) -> Path:
    """Where the library built from ``source`` for this CPU is cached (named by a hash of the source, the flags and
    the CPU, not the compiler: a library any compiler built serves, even on a host that has none)."""
    import xxhash

    key = xxhash.xxh64(b"\0".join([source.read_bytes(), " ".join((*_FLAGS, *_TUNED)).encode(), _cpu().encode()]))
    return cache_dir() / "native" / f"{source.stem}-{key.hexdigest()}.so"


def native_library(source: Path) -> ctypes.CDLL:
    """``source`` (C) as a loaded shared library: from the cache when built before, else compiled now."""
    lib = library_path(source)
    try:
        return ctypes.CDLL(str(lib))
    except OSError:  # not built yet here (or a damaged file: built again)
        pass
    cc = _compiler()
    try:
        lib.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = lib.with_name(f".{lib.name}.{os.getpid()}.tmp")
        try:
            _build(cc, source, tmp)
            os.replace(tmp, lib)  # whole or not at all: a concurrent process loads either
        finally:
            tmp.unlink(missing_ok=True)
        return ctypes.CDLL(str(lib))
    except OSError:  # the cache folder cannot be written: a library for this process only
        with tempfile.TemporaryDirectory(prefix="hsstore-native-") as tmp_dir:
            private = Path(tmp_dir) / lib.name
            _build(cc, source, private)
            return ctypes.CDLL(str(private))  # (mapped: the file may go)

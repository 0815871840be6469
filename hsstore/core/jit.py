"""numba-compiled loops whose machine code is cached on disk where it can be, and compiled in process where not.

numba compiles a function at its first call and saves the machine code beside the source (or in
``NUMBA_CACHE_DIR``). A read-only install raises RuntimeError when a function is wrapped; a save that fails
(a full disk, a file-size limit, a folder made read-only since) raises OSError from the first call, before
the loop runs. Either way the command should run, only slower to start: ``JitLoops`` compiles again
without the cache and calls again.
"""

from __future__ import annotations

from collections.abc import Callable
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

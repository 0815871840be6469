"""Readahead hints issued from a small helper process, so that they never wait for this process's GIL.

``posix_fadvise(WILLNEED)`` fills the page cache, which every process on the host shares: a hint given by
another process serves this one's reads alike. Given from a thread of the reading process, each hint
(one call per array and sample, several per 8 MiB step) must take the GIL back after its system call,
behind the reader's decode threads; a helper process has its own interpreter and does nothing else.

The helper is a bare interpreter (``python -S``, no hsstore, no torch; ~20 ms to start) reading lines
``fd dev ino offset bytes step`` on its stdin. It opens each file through ``/proc/<reader pid>/fd/<fd>``
(the reader's own open file, whatever happens to the path since) and only if the device and inode match
what the reader sent, and exits when its stdin closes (the reader closed it, or the reader died).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

_HELPER = r"""
import os, sys
ppid, fds = int(sys.argv[1]), {}
for line in sys.stdin.buffer:
    fd, dev, ino, off, n, step = map(int, line.split())
    f = fds.get((dev, ino))
    if f is None:
        try:
            f = os.open(f"/proc/{ppid}/fd/{fd}", os.O_RDONLY)
        except OSError:
            continue
        st = os.fstat(f)
        if (st.st_dev, st.st_ino) != (dev, ino):
            os.close(f)
            continue
        fds[(dev, ino)] = f
    for at in range(off, off + n, step):
        try:
            os.posix_fadvise(f, at, min(step, off + n - at), os.POSIX_FADV_WILLNEED)
        except OSError:
            break
"""


def _can_help() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "posix_fadvise") and os.path.isdir(f"/proc/{os.getpid()}/fd")


class HintProcess:
    """A helper process that asks the kernel to read file ranges of this process's open files ahead."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", _HELPER, str(os.getpid())], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)

    def send(self, spans: Sequence[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
        """Hand ``(source, offset, bytes)`` of local files to the helper; returns the spans it cannot take
        (sources that are not local files), for the caller to hint itself."""
        lines, rest = [], []
        for src, offset, n in spans:
            ident = getattr(src, "ident", None)
            if ident is None or getattr(src, "fd", -1) < 0:
                rest.append((src, offset, n))
            else:
                lines.append(f"{src.fd} {ident[0]} {ident[1]} {offset} {n} {src.step}\n")
        if lines:
            self.proc.stdin.write("".join(lines).encode())  # one write, one GIL hand-back a sample
            self.proc.stdin.flush()
        return rest

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stuck behind a full disk queue: its hints no longer matter
            self.proc.kill()
            self.proc.wait()


def start_helper() -> HintProcess | None:
    """A running HintProcess, or None where one cannot run (not Linux, no /proc, no process could start)."""
    if not _can_help():
        return None
    try:
        return HintProcess()
    except OSError:
        return None

"""Every report a command prints goes through ``write_stdout``: all of it reaches stdout, or the command
fails in one line (exit 1) — a full disk, a file-size limit (``ulimit -f``: SIGXFSZ is ignored, so the
write comes back short) or a closed pipe never ends as a traceback or as exit 0 with the JSON cut off."""

from __future__ import annotations

import errno
import os
import sys

from hsstore.core.errors import OutputFailed


def write_stdout(text: str) -> None:
    """Write ``text`` and a newline to stdout, every byte or OutputFailed naming how far it got."""
    data = (text + "\n").encode("utf-8", "surrogateescape")
    try:
        sys.stdout.flush()  # what typer or print() buffered goes first
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # a replaced stdout (tests' capture): its own write
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    done = 0
    view = memoryview(data)
    while done < len(data):
        try:
            n = os.write(fd, view[done:])
        except InterruptedError:
            continue
        except OSError as e:
            raise _failed(e.errno, e.strerror or str(e), done, len(data)) from None
        if n <= 0:
            raise _failed(errno.EFBIG, "nothing more could be written", done, len(data))
        done += n


def _failed(code: int | None, why: str, done: int, total: int) -> OutputFailed:
    if code == errno.EPIPE:  # the reader went away (`| head`): say so once, and stop writing there
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return OutputFailed(f"writing the report to stdout failed: the pipe was closed after {done} of {total} "
                            "bytes; read the whole output or write it to a file")
    return OutputFailed(f"writing the report to stdout failed after {done} of {total} bytes: {why}; the output "
                        "is incomplete — free space or raise the file-size limit (ulimit -f), or write it elsewhere")

"""Output files the user names on the command line (``--json FILE``, ``--plot PNG``): checked before any
work starts, so a typo in a path costs one line, not a finished diff (storage.fileio writes them).

Where a report goes, by what the path is now:
- nothing, or a regular file: written whole beside it and renamed over it (a reader sees the old file or
  the new one; nothing half-written is left by a full disk or a signal);
- a FIFO, a device, or a descriptor link (``/dev/stdout``, ``/dev/fd/3``, ``>(jq .)``): streamed into it,
  as a shell redirection would, never renamed over;
- a symbolic link to anything else (a regular file, nothing): refused — hsstore does not write through a
  link it did not make (someone else's link in a shared folder must not redirect the report onto a file
  of theirs), nor replace the link itself.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hsstore.core.errors import BadInput

# what matplotlib's Agg canvas writes (the plot's suffix picks the format)
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")
_LINK_HOPS = 40  # as the kernel's own limit on links followed


def streamed(path: str) -> bool:
    """Whether the output ``path`` is written into as it is (a FIFO, a device, a descriptor link such as
    ``/dev/stdout``) rather than replaced whole; BadInput for a link hsstore will not write through."""
    p = os.path.expanduser(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return False
    if not stat.S_ISLNK(st.st_mode):
        return True  # a FIFO, a character device, a socket
    try:
        target = os.stat(p)
    except OSError:
        target = None
    if target is not None and not (stat.S_ISREG(target.st_mode) or stat.S_ISDIR(target.st_mode)):
        return True
    if _through_descriptor(p):
        return True  # /dev/stdout redirected to a file by the shell: the shell chose the file
    where = os.path.realpath(p)
    raise BadInput(
        f"output {path!r} is a symbolic link (to {where!r}); hsstore does not write through links — name "
        "the file itself, or remove the link"
    )


def _through_descriptor(p: str) -> bool:
    """Whether following the links of ``p`` passes through a process's descriptor (``/proc/*/fd/N``)."""
    for _ in range(_LINK_HOPS):
        parts = Path(os.path.abspath(p)).parts
        if len(parts) >= 4 and parts[1] == "proc" and parts[3] == "fd":
            return True
        if not os.path.islink(p):
            return False
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return False


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse (exit 2) an output file that cannot be written: its folder is missing or not a folder, the
    path is a folder or a link hsstore will not write through, or its suffix is not one of ``suffixes``
    (when given)."""
    p = Path(path).expanduser()  # (an empty path is refused before, by check_outside_stores)
    if p.is_dir():
        raise BadInput(f"{option} {path!r} is a folder; name a file inside it")
    try:
        if streamed(path):
            return  # /dev/stdout, a FIFO: its folder and suffix do not matter
    except BadInput as e:
        raise BadInput(f"{option} {e}".replace("output ", "", 1)) from None
    if suffixes and p.suffix.lower() not in suffixes:
        raise BadInput(
            f"{option} {path!r}: unknown file type {p.suffix or '(none)'!r}; use one of {', '.join(suffixes)}"
        )
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise BadInput(f"{option} {path!r}: folder {str(parent)!r} {what}; create it or write the file elsewhere")
    if not os.access(parent, os.W_OK):
        raise BadInput(f"{option} {path!r}: folder {str(parent)!r} is not writable; write the file elsewhere")


def check_distinct_outputs(paths: dict[str, str | None]) -> None:
    """Refuse (exit 2) two output options naming one file (``--json r.png --plot r.png``): the one written
    last would replace the other, and the command would still exit 0 as if both were written."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None or path == "-" or streamed(path):
            continue
        real = os.path.realpath(os.path.expanduser(path))
        if real in seen:
            raise BadInput(
                f"{seen[real]} and {option} both name {path!r}; the second would replace the first — name two files"
            )
        seen[real] = option


def check_not_an_input(path: str | None, option: str, inputs: dict[str, str]) -> None:
    """Refuse (exit 2) an output file that is a file of one of the command's inputs (``--json MODEL/config.json``
    of ``check MODEL``): the report would replace a file the command itself reads. ``inputs``: what each is ->
    its path (a file or a folder)."""
    if path is None or path == "-" or streamed(path):
        return
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.isfile(real):
        return  # a new file (beside an input or not) replaces nothing
    for what, given in inputs.items():
        root = os.path.realpath(os.path.expanduser(given))
        if real == root or (os.path.isdir(root) and real.startswith(root.rstrip(os.sep) + os.sep)):
            raise BadInput(
                f"{option} {path!r} is a file of {what} {given!r}, which this command reads; the report "
                "would replace it — write the report elsewhere"
            )


# --- User paths: a leading ``~`` (``~`` or ``~user``) means a home folder, as in a shell, wherever hsstore takes a path.


def expand_user(path: str) -> str:
    """``path`` with a leading ``~``/``~user`` expanded (URLs, ``builtin:`` names and other paths unchanged).
    A shell does this for an unquoted argument; a manifest value, a quoted argument or ``--store=~/x``
    reach hsstore unexpanded, and a user means the same folder."""
    return os.path.expanduser(path) if path.startswith("~") else path


# --- Sizes and durations as people read them (pure): three significant digits and a unit.


def byte_size(n: float | None) -> str:
    """``n`` bytes as "1.24 GB", "981 kB" or "12 B" (decimal units, as disks are sold); "unknown" for None."""
    if n is None:
        return "unknown"
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float | None) -> str:
    """``seconds`` as "5.71 s" or "3.2 h"; "unknown" for None."""
    if seconds is None:
        return "unknown"
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds:.3g} s"

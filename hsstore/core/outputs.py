"""Output files the user names on the command line (``--json FILE``, ``--plot PNG``): checked before any
work starts, so a typo in a path costs one line, not a finished diff (storage.fileio writes them)."""

from __future__ import annotations

import os
from pathlib import Path

from hsstore.core.errors import BadInput

# what matplotlib's Agg canvas writes (the plot's suffix picks the format)
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse (exit 2) an output file that cannot be written: its folder is missing or not a folder, the
    path is a folder, or its suffix is not one of ``suffixes`` (when given)."""
    p = Path(path).expanduser()
    if not path.strip():
        raise BadInput(f"{option} is empty; name a file to write, e.g. {option} report{(suffixes or ('.json',))[0]}")
    if p.is_dir():
        raise BadInput(f"{option} {path!r} is a folder; name a file inside it")
    if suffixes and p.suffix.lower() not in suffixes:
        raise BadInput(f"{option} {path!r}: unknown file type {p.suffix or '(none)'!r}; use one of {', '.join(suffixes)}")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise BadInput(f"{option} {path!r}: folder {str(parent)!r} {what}; create it or write the file elsewhere")
    if not os.access(parent, os.W_OK):
        raise BadInput(f"{option} {path!r}: folder {str(parent)!r} is not writable; write the file elsewhere")

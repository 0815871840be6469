"""What hsstore writes outside its stores stays outside them: a report (``--json``, ``--plot``), an export
folder or a vocab-map folder inside a store would be a file no writer of that store made — ``verify``
would call it damage for good, and a report named ``STORE/zarr.json`` would replace the store's root
record (the store no longer opens)."""

from __future__ import annotations

import os
from pathlib import Path

from hsstore.core.errors import BadInput
from hsstore.storage import layout
from hsstore.storage.store import enclosing_store


def check_outside_stores(path: str, what: str) -> None:
    """Refuse (exit 2) an output file or folder ``path`` that is empty (an unset shell variable: it would
    mean the current folder), an hsstore store or inside one."""
    if not path.strip():
        raise BadInput(f"{what} is an empty path ({path!r}); name the folder to write, e.g. ./out")
    outer = enclosing_store(Path(os.path.expanduser(path)) / layout.root_meta())  # the store itself, or one above
    if outer is not None:
        raise BadInput(f"{what} {path!r} is inside the hsstore store {str(outer)!r}; hsstore writes reports and "
                       "exports outside its stores — choose a path outside it")

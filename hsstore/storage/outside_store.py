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
        raise BadInput(f"{what} is an empty path ({path!r}); name the file or folder to write")
    outer = enclosing_store(Path(os.path.expanduser(path)) / layout.root_meta())  # the store itself, or one above
    if outer is not None:
        raise BadInput(f"{what} {path!r} is inside the hsstore store {str(outer)!r}; hsstore writes reports and "
                       "exports outside its stores — choose a path outside it")


def check_store_outside_source(store: str, source: str) -> None:
    """Refuse (exit 2) a store inside the folder an import reads, or that folder inside the store: the store's
    files would become files of the tool's cache (EAGLE's loader loads every file of its folder), or the
    import would read the store's own files."""
    if "://" in store:
        return
    s, src = os.path.realpath(os.path.expanduser(store)), os.path.realpath(os.path.expanduser(source))
    inside = s == src or s.startswith(src.rstrip(os.sep) + os.sep) or src.startswith(s.rstrip(os.sep) + os.sep)
    if inside:
        raise BadInput(f"store {store!r} and the import folder {source!r} lie one inside the other; the store's files "
                       "would become part of the tool's cache — put the store outside the folder")

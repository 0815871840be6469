"""A mark on an export folder: a random token in an extended attribute of the folder (``user.hsstore.export``)
and in the export's record. A folder removed and made anew in its place (``rm -rf ge_data`` and another tool
writing ``ge_data`` again: even the inode number comes back) has no mark, so a record that outlived its
folder — EAGLE's lies beside it — is not taken for the new folder's. Where the file system keeps no
extended attributes the mark is absent and nothing is checked by it."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

XATTR = "user.hsstore.export"


def folder_mark(dest: Path) -> str | None:
    """The folder's token; "" if it has none; None where the file system cannot say (no extended attributes)."""
    try:
        return os.getxattr(dest, XATTR).decode("ascii", "replace")
    except OSError as e:
        return "" if e.errno == errno.ENODATA else None


def mark_folder(dest: Path) -> str | None:
    """The folder's token, given a new one if it has none; None where the file system keeps no such marks."""
    token = folder_mark(dest)
    if token:
        return token
    token = uuid.uuid4().hex
    try:
        os.setxattr(dest, XATTR, token.encode())
    except OSError:  # no extended attributes here (or no room for one): the folder goes unmarked
        return None
    return token

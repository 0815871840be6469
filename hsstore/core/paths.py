"""User paths: a leading ``~`` (``~`` or ``~user``) means a home folder, as in a shell, wherever hsstore takes a path."""

from __future__ import annotations

import os


def expand_user(path: str) -> str:
    """``path`` with a leading ``~``/``~user`` expanded (URLs, ``builtin:`` names and other paths unchanged).
    A shell does this for an unquoted argument; a manifest value, a quoted argument or ``--store=~/x``
    reach hsstore unexpanded, and a user means the same folder."""
    return os.path.expanduser(path) if path.startswith("~") else path

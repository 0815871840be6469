"""The cache formats hsstore imports and exports, by name."""

from __future__ import annotations

from hsstore.core.errors import BadInput
from hsstore.interop.formats.interface import Format


def get_format(name: str) -> Format:
    """A fresh instance of the format ``name`` (specforge | modelopt | speculators | eagle)."""
    from hsstore.interop.formats.eagle import Eagle
    from hsstore.interop.formats.modelopt import ModelOpt
    from hsstore.interop.formats.specforge import SpecForge
    from hsstore.interop.formats.speculators import Speculators

    table = {"specforge": SpecForge, "modelopt": ModelOpt, "speculators": Speculators, "eagle": Eagle}
    if name not in table:
        raise BadInput(f"unknown format {name!r}; choose one of {', '.join(table)}")
    return table[name]()

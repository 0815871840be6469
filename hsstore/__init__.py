"""hsstore: cached hidden states for speculative-decoding drafters, with provenance you can check.

The public names are loaded on first use, so ``import hsstore`` (and ``hsstore --help``) costs only
the error classes; ``hsstore.Store`` imports the storage layer, ``hsstore.HiddenStateDataset`` the
read layer, ``hsstore.check_live_model`` the compare layer.
"""

from __future__ import annotations

import importlib
from typing import Any

from hsstore.core.errors import BadInput, CorruptData, HsstoreError, ProvenanceMismatch, SelectorError

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    "Store": "hsstore.storage.store",
    "Variant": "hsstore.storage.store",
    "HiddenStateDataset": "hsstore.read.dataset",
    "StreamingHiddenStateDataset": "hsstore.read.streaming",
    "pad_collate": "hsstore.read.dataset",
    "check_live_model": "hsstore.compare.check",
}

__all__ = ["BadInput", "CorruptData", "HsstoreError", "ProvenanceMismatch", "SelectorError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hsstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

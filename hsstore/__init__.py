"""hsstore: cached hidden states for speculative-decoding drafters, with provenance you can check."""

from __future__ import annotations

from .errors import BadInput, CorruptData, HsstoreError, ProvenanceMismatch, SelectorError
from .store import Store, Variant

__version__ = "0.1.0"

__all__ = [
    "BadInput",
    "CorruptData",
    "HiddenStateDataset",
    "HsstoreError",
    "ProvenanceMismatch",
    "SelectorError",
    "Store",
    "StreamingHiddenStateDataset",
    "Variant",
    "__version__",
]


def __getattr__(name: str):  # the dataset classes import torch.utils.data lazily
    if name in ("HiddenStateDataset", "StreamingHiddenStateDataset"):
        from . import dataset

        return getattr(dataset, name)
    raise AttributeError(name)

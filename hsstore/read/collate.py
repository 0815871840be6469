"""Padding dataset items into a batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hsstore.core.errors import BadInput

REQUIRED = ("input_ids", "loss_mask")
STATES = ("aux_hidden", "target_hidden", "aux_scales", "target_scales")
OPTIONAL = ("key", "index")  # a dataset's items carry them; items built elsewhere may not: kept when all do


def _check_items(items: Sequence[dict[str, Any]]) -> list[str]:
    """The fields every item has that the batch carries; BadInput naming the field and the item when an
    item lacks one the batch needs (``input_ids``, ``loss_mask``, or a state field the first item has)."""
    if not items:
        raise BadInput("pad_collate got no items; pass a non-empty list of dataset items")
    first = items[0]
    states = [k for k in STATES if k in first]
    for n, it in enumerate(items):
        missing = [k for k in (*REQUIRED, *states) if k not in it]
        if missing:
            raise BadInput(f"pad_collate: item {n} has no {', '.join(repr(k) for k in missing)} (it has "
                           f"{sorted(it)}); pass items as HiddenStateDataset returns them, each with "
                           f"{', '.join(REQUIRED)} and the same state fields")
    return [k for k in OPTIONAL if all(k in it for it in items)] + states


def pad_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Right-pad items into a batch with ``attention_mask`` (True = real token). ``key`` and ``index``
    are carried when every item has them (items built outside a dataset may have neither); an item
    without ``input_ids``, ``loss_mask`` or a state field the first item has is a BadInput naming it."""
    fields = _check_items(items)
    T = max(it["input_ids"].shape[0] for it in items)
    B = len(items)
    first = items[0]
    out: dict[str, Any] = {
        "input_ids": torch.zeros((B, T), dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.bool),
        "attention_mask": torch.zeros((B, T), dtype=torch.bool),
    }
    if "key" in fields:
        out["key"] = [it["key"] for it in items]
    if "index" in fields:
        out["index"] = torch.tensor([it["index"] for it in items], dtype=torch.long)
    padded = [k for k in STATES if k in fields]
    for k in padded:  # (float8 codes are padded through their bytes: zeros either way)
        x = first[k].view(torch.uint8) if first[k].dtype == torch.float8_e4m3fn else first[k]
        out[k] = torch.zeros((B, T, *x.shape[1:]), dtype=x.dtype)
    for b, it in enumerate(items):
        n = it["input_ids"].shape[0]
        out["input_ids"][b, :n] = it["input_ids"]
        out["loss_mask"][b, :n] = it["loss_mask"]
        out["attention_mask"][b, :n] = True
        for k in padded:
            out[k][b, :n] = it[k].view(torch.uint8) if it[k].dtype == torch.float8_e4m3fn else it[k]
    for k in padded:
        if first[k].dtype == torch.float8_e4m3fn:
            out[k] = out[k].view(torch.float8_e4m3fn)
    return out

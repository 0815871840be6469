"""Padding dataset items into a batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def pad_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Right-pad items into a batch with ``attention_mask`` (True = real token)."""
    T = max(it["input_ids"].shape[0] for it in items)
    B = len(items)
    first = items[0]
    out = {
        "key": [it["key"] for it in items],
        "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
        "input_ids": torch.zeros((B, T), dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.bool),
        "attention_mask": torch.zeros((B, T), dtype=torch.bool),
    }
    padded = [k for k in ("aux_hidden", "target_hidden", "aux_scales", "target_scales") if k in first]
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

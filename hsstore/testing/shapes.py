"""Model shapes the benchmarks build: name -> (config overrides of the builtin hybrid, aux layers, target layers)."""

from __future__ import annotations

import json
from typing import Any

SHAPES: dict[str, tuple[dict[str, Any], list[int], list[int]]] = {
    "tiny": ({}, [0, 1, 2], [3]),
    # Qwen3.5/3.6-27B-shaped decoder (64 layers, hidden 5120; the builtin byte tokenizer keeps the
    # embedding small, so the model has ~24.5 B decoder parameters rather than 26.9 B in total)
    "27b": ({"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
             "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128}, [1, 16, 31, 46], [61]),
    # the 1.6 B hybrid of the seed experiment (hidden 2048, 24 layers): small enough to draw on a CPU
    "1.6b": ({"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128}, [1, 8, 15], [22]),
}


def config_toml(shape: str) -> str:
    """The manifest's ``config = { ... }`` line of ``shape`` ("" for a shape that overrides nothing)."""
    overrides = SHAPES[shape][0]
    if not overrides:
        return ""
    return "config = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in overrides.items()) + " }"


def layers_toml(shape: str) -> str:
    """The manifest's ``layers`` table of ``shape``: ``{ aux = [...], target = [...] }``."""
    _, aux, target = SHAPES[shape]
    return f"{{ aux = {aux}, target = {target} }}"

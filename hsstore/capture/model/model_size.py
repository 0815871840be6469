"""A builtin model's size from its config, checked against the memory budget before its config is even
made: ``hidden_size = 1e9`` or 10^8 layers is one line, not a worker growing for minutes (a local
checkpoint's config is checked against its weight files instead: hsstore.capture.model.weight_files)."""

from __future__ import annotations

from typing import Any

from hsstore.core.budget import check_fits


def min_parameters(tc: Any) -> int:
    """A lower bound on a decoder-only model's parameters: its embedding and every layer's MLP."""
    def num(key: str) -> int:
        v = getattr(tc, key, 0)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    h, inter = num("hidden_size"), num("intermediate_size")
    return num("vocab_size") * h + num("num_hidden_layers") * 3 * h * inter


def check_builtin_fits(tc: Any, model: str) -> None:
    """ResourceLimit when a builtin's weights (drawn in fp32) cannot fit the memory budget."""
    check_fits(4 * min_parameters(tc), f"{model} with these config overrides ({min_parameters(tc):,} parameters "
               "at least, drawn in fp32)", "choose smaller [model] config overrides (hidden_size, num_hidden_layers, "
               "intermediate_size)")

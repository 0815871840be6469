"""Relative L2 distances between stored and live states, in float64 sums."""

from __future__ import annotations

import math

import torch


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| in float64 sums (nan when y is empty or zero)."""
    if x.shape[0] == 0:
        return math.nan
    d = (x.float() - y.float()).double()
    den = float(y.double().square().sum())
    return math.sqrt(float(d.square().sum()) / den) if den > 0 else (0.0 if float(d.abs().sum()) == 0 else math.inf)


def row_rel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row ||x_t - y_t|| / ||y_t|` ``[T]`` (float64)."""
    d = torch.linalg.vector_norm((x.float() - y.float()).double(), dim=1)
    n = torch.linalg.vector_norm(y.double(), dim=1)
    return torch.where(n > 0, d / n.clamp_min(1e-300), torch.where(d > 0, torch.inf, 0.0))

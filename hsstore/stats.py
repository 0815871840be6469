"""Per-layer health statistics: computed at write time, aggregated by adding, judged by rules."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

FIELDS = ("n", "sum", "sumsq", "absmax", "min", "max", "nan", "inf", "zeros")
_MIN_MAX = {"absmax": max, "max": max, "min": min}


def layer_stats(states: torch.Tensor) -> dict[str, float]:
    """Additive statistics of one layer's states ``[T, H]`` (any float dtype)."""
    x = states.detach().float()
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return {
        "n": int(x.numel()),
        "sum": float(xf.double().sum()),
        "sumsq": float((xf.double() ** 2).sum()),
        "absmax": float(xf.abs().max()) if x.numel() else 0.0,
        "min": float(xf.min()) if x.numel() else 0.0,
        "max": float(xf.max()) if x.numel() else 0.0,
        "nan": int(torch.isnan(x).sum()),
        "inf": int(torch.isinf(x).sum()),
        "zeros": int((x == 0).sum()),
    }


def merge(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in parts:
        for k in FIELDS:
            if k not in out:
                out[k] = p[k]
            elif k in _MIN_MAX:
                out[k] = _MIN_MAX[k](out[k], p[k])
            else:
                out[k] = out[k] + p[k]
    return out or {k: 0 for k in FIELDS}


def summary(s: Mapping[str, float]) -> dict[str, float]:
    """mean, std, abs-max, NaN/Inf count and zero fraction from additive stats."""
    n = max(1, s["n"])
    mean = s["sum"] / n
    var = max(0.0, s["sumsq"] / n - mean * mean)
    return {
        "mean": mean,
        "std": math.sqrt(var),
        "absmax": s["absmax"],
        "nan": s["nan"],
        "inf": s["inf"],
        "zero_fraction": s["zeros"] / n,
    }


def problems(s: Mapping[str, float]) -> list[str]:
    """Plain words for what is wrong with these states: NaN/Inf, all zero, constant."""
    out = []
    if s["nan"] or s["inf"]:
        out.append(f"{s['nan']} NaN and {s['inf']} Inf values")
    if s["n"] and s["zeros"] == s["n"]:
        out.append("all values are zero")
    elif s["n"] > 1 and s["min"] == s["max"]:
        out.append("all values are equal (constant layer)")
    return out

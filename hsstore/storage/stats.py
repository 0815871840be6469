"""Per-layer health statistics: computed at write time, aggregated by adding, judged by rules.

Writers compute them with torch on the states' device (``stats_tensor``); ``array_stats`` computes the
same statistics of stored values with numpy alone, so verifying a store never loads torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from hsstore.core.schema.reports import LayerHealth

if TYPE_CHECKING:
    import torch

FIELDS = ("n", "sum", "sumsq", "absmax", "min", "max", "nan", "inf", "zeros")
COUNTS = ("n", "nan", "inf", "zeros")  # the fields that are counts (integers)
_MIN_MAX = {"absmax": max, "max": max, "min": min}
_HEAD = len(FIELDS)  # stats_tensor's leading values, one per field


def stats_tensor(states: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Health statistics of one layer's states ``[T, H]`` as one float64 tensor on the states' device:
    ``[n, sum, sumsq, absmax, min, max, nan, inf, zeros, absmax of each sample...]``.

    On a GPU it never syncs with the host (it runs before the device-to-host copy and travels with the
    states). On the CPU it takes six passes: NaN/Inf are counted only when min/max say there are any.
    """
    import torch

    x = states.detach()
    xf = x.float()
    if xf.numel() == 0:
        return torch.zeros(_HEAD + len(lengths), dtype=torch.float64, device=x.device)
    cpu = x.device.type == "cpu"
    lo, hi = torch.aminmax(xf)
    if cpu and bool(torch.isfinite(lo) & torch.isfinite(hi)):
        nan = inf = torch.zeros((), dtype=torch.int64)
    else:
        nan, inf = torch.isnan(xf).sum(), torch.isinf(xf).sum()
        xf = torch.nan_to_num(xf, nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = torch.aminmax(xf)
    acc = None if cpu else torch.float64  # CPU float32 sums are cascaded (accurate) and far faster
    total = xf.sum(dtype=acc).double()
    sumsq = torch.linalg.vector_norm(xf, dtype=acc).double() ** 2
    if acc is None and not bool(torch.isfinite(total) & torch.isfinite(sumsq)):  # finite states past ~1e19: float32
        total, sumsq = xf.sum(dtype=torch.float64), torch.linalg.vector_norm(xf, dtype=torch.float64) ** 2  # overflowed
    row_lo, row_hi = torch.aminmax(xf, dim=1) if xf.dim() > 1 else (xf, xf)
    row = torch.maximum(row_lo.abs(), row_hi.abs())
    per = torch.segment_reduce(row, "max", lengths=torch.tensor(lengths, device=x.device))
    head = torch.stack(
        [
            torch.tensor(float(xf.numel()), dtype=torch.float64, device=x.device),
            total,
            sumsq,
            torch.maximum(lo.abs(), hi.abs()).double(),
            lo.double(),
            hi.double(),
            nan.double(),
            inf.double(),
            (xf == 0).sum().double(),
        ]
    )
    return torch.cat([head, per.double()])


def from_stats_tensor(values: list[float]) -> tuple[dict[str, float], list[float]]:
    """(additive stats, per-sample abs-max) from ``stats_tensor(...).tolist()``."""
    head = dict(zip(FIELDS, values[:_HEAD]))
    for k in COUNTS:
        head[k] = int(head[k])
    return head, values[_HEAD:]


def layer_stats(states: torch.Tensor) -> dict[str, float]:
    """Additive statistics of one layer's states ``[T, H]``."""
    return from_stats_tensor(stats_tensor(states, [int(states.shape[0])]).tolist())[0]


def array_stats(x: np.ndarray) -> dict[str, float]:
    """``layer_stats`` of float32 values ``[T, H]`` with numpy: NaN and Inf are counted, then read as 0
    (so a NaN counts as a zero, as on the torch path); sums in float64."""
    nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    if nan or inf:
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    if x.size == 0:
        return {k: 0 if k in COUNTS else 0.0 for k in FIELDS}
    lo, hi = float(x.min()), float(x.max())
    return {
        "n": int(x.size),
        "sum": float(x.sum(dtype=np.float64)),
        "sumsq": float(np.square(x, dtype=np.float64).sum()),
        "absmax": max(abs(lo), abs(hi)),
        "min": lo,
        "max": hi,
        "nan": nan,
        "inf": inf,
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


def summary(s: Mapping[str, float]) -> LayerHealth:
    """mean, std, abs-max, NaN/Inf count and zero fraction from additive stats."""
    n = max(1, s["n"])
    mean = s["sum"] / n
    var = max(0.0, s["sumsq"] / n - mean * mean)
    # the counts are ints at run time (HealthStats, array_stats, from_stats_tensor); int() says so to the type
    return LayerHealth(
        mean=mean,
        std=math.sqrt(var),
        absmax=s["absmax"],
        nan=int(s["nan"]),
        inf=int(s["inf"]),
        zero_fraction=s["zeros"] / n,
    )


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


def merge_health(parts: list[torch.Tensor]) -> torch.Tensor:
    """One ``stats_tensor`` of concatenated samples from each sample's own (``[head..., absmax]``)."""
    import torch

    head = torch.stack([p[: len(FIELDS)] for p in parts])  # (samples, fields)
    out = head.sum(0)
    out[FIELDS.index("absmax")] = head[:, FIELDS.index("absmax")].max()
    out[FIELDS.index("max")] = head[:, FIELDS.index("max")].max()
    out[FIELDS.index("min")] = head[:, FIELDS.index("min")].min()
    return torch.cat([out, *[p[len(FIELDS) :] for p in parts]])


def health_problems(x: np.ndarray, span: tuple[Any, Any] | None = None) -> list[str]:
    """``problems(array_stats(x))`` of float32 values, in two passes where the values are finite (min and
    max alone decide: all zero and constant both mean min == max; ``span``: those two, taken already); verify asks
    this of every sample."""
    if x.size == 0:
        return []
    lo, hi = span if span is not None else (x.min(), x.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN or Inf: counted in full
        return problems(array_stats(x))
    if lo != hi:
        return []
    n = int(x.size)
    return problems({"n": n, "nan": 0, "inf": 0, "zeros": n if lo == 0 else 0, "min": float(lo), "max": float(hi)})

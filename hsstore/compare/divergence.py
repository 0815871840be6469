"""Divergence statistics between two sets of hidden states: per-sample sums and what is reported.

A sample's ``[T, H]`` states of each layer reduce (``hsstore.compare.kernel``) to per-token sums; ``summarize``
turns those into one float64 row of additive sums per layer (``COLUMNS``: tokens, values, sum |d|,
exact values, |d|², |b|², sum of 1 - cos, ULP buckets), two maxima (``MAXES``) and a fixed log-scale
histogram of per-token 1 - cos. Every reported statistic is a function of sums over samples
(``layer_stats``): a full diff adds every sample's row, a sampled one weights them
(``hsstore.compare.sampling``). Memory does not grow with the number of samples. The 1st percentile
of cosine is read from the histogram (accurate to one bin, ~1% relative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsstore.compare.kernel import ULP_BUCKETS, TokenSums, Workspace

EDGES = torch.logspace(-12, math.log10(2.0), 1201, dtype=torch.float64)  # bins of (1 - cos)
N_BINS = len(EDGES) + 1
COLUMNS = ("tokens", "values", "sum_abs", "exact", "sq_diff", "sq_ref", "cos1m_sum") + tuple(
    f"ulp_{b}" for b in ULP_BUCKETS
)
MAXES = ("max_abs", "cos1m_max")
C = {name: i for i, name in enumerate(COLUMNS)}
M = {name: i for i, name in enumerate(MAXES)}


@dataclass
class SampleSums:
    """One sample's sums: ``sums [L, len(COLUMNS)]`` float64, ``maxes [L, 2]``, ``hist [L, N_BINS]`` int64."""

    key: str
    sums: np.ndarray
    maxes: np.ndarray
    hist: np.ndarray

    def rel_l2(self, layer_index: int = -1) -> float:
        d, r = self.sums[layer_index, C["sq_diff"]], self.sums[layer_index, C["sq_ref"]]
        return math.sqrt(d / r) if r > 0 else (0.0 if d == 0 else math.inf)


def one_minus_cos(dd: torch.Tensor, aa: torch.Tensor, bb: torch.Tensor, ad: torch.Tensor) -> torch.Tensor:
    """Per-token 1 - cos(a, b) in float64 from float32 sums, without cancellation (see kernel).
    Two zero vectors agree (0); one zero vector does not (1)."""
    dd, aa, bb, ad = dd.double(), aa.double(), bb.double(), ad.double()
    na, nb = aa.sqrt(), bb.sqrt()
    norm_gap = (2 * ad - dd) / (na + nb).clamp_min(1e-300)  # |a| - |b|
    num = (dd - norm_gap * norm_gap).clamp_min(0.0)
    den = 2 * na * nb
    degenerate = torch.where(na == nb, 0.0, 1.0).to(dd.dtype)
    return torch.where(den > 0, num / den.clamp_min(1e-300), degenerate).clamp(0.0, 2.0)


def summarize(key: str, ts: TokenSums, hidden: int, ws: Workspace | None = None) -> SampleSums:
    """The per-layer sums of one sample from its per-token sums ``[L, T]``: on ``ws``'s compiled loops where it
    takes them (one pass, no torch op: maxima within 1 ULP, a histogram that moves only tokens within 1 ULP of an
    edge, sums within float64 rounding), else
    torch's ops."""
    kernel = ws.kernel() if ws is not None and ts.dd.device.type == "cpu" else False
    if kernel:
        return _summarize_compiled(key, ts, hidden, kernel)
    L, T = ts.dd.shape
    omc = one_minus_cos(ts.dd, ts.aa, ts.bb, ts.ad)  # [L, T]
    cols = torch.zeros((L, len(COLUMNS)), dtype=torch.float64, device=omc.device)
    cols[:, C["tokens"]] = T
    cols[:, C["values"]] = T * hidden
    cols[:, C["sum_abs"]] = ts.sum_abs.double().sum(1)
    cols[:, C["exact"]] = T * hidden - ts.differing.double().sum(1)
    cols[:, C["sq_diff"]] = ts.dd.double().sum(1)
    cols[:, C["sq_ref"]] = ts.bb.double().sum(1)
    cols[:, C["cos1m_sum"]] = omc.sum(1)
    if ts.ulp is not None:  # counts above 0, 1, 2, 4, 8, 16 ULPs -> the buckets of ULP_BUCKETS
        above = torch.cat([ts.ulp, torch.zeros((L, 1), dtype=torch.float64, device=ts.ulp.device)], dim=1)
        below = torch.cat([cols[:, C["values"] : C["values"] + 1], ts.ulp], dim=1)
        cols[:, C["ulp_0"] :] = below - above
    maxes = (
        torch.stack([ts.max_abs.amax(1).double(), omc.amax(1)], dim=1)
        if T
        else torch.zeros((L, 2), dtype=torch.float64)
    )
    bins = torch.bucketize(omc, EDGES.to(omc.device)) + N_BINS * torch.arange(L, device=omc.device)[:, None]
    hist = torch.bincount(bins.view(-1), minlength=N_BINS * L).view(L, N_BINS)
    return SampleSums(key, cols.cpu().numpy(), maxes.cpu().numpy(), hist.cpu().numpy())


_EDGES = EDGES.numpy()


def _summarize_compiled(key: str, ts: TokenSums, hidden: int, kernel: Any) -> SampleSums:
    L, T = ts.dd.shape
    part, maxes = np.zeros((L, 5)), np.zeros((L, len(MAXES)))
    hist = np.zeros((L, N_BINS), dtype=np.int64)
    kernel.summary_rows(
        [x.numpy() for x in (ts.dd, ts.aa, ts.bb, ts.ad, ts.sum_abs, ts.differing, ts.max_abs)],
        _EDGES,
        part,
        maxes,
        hist,
    )
    cols = np.zeros((L, len(COLUMNS)))
    cols[:, C["tokens"]], cols[:, C["values"]] = T, T * hidden
    cols[:, C["sum_abs"]], cols[:, C["exact"]] = part[:, 0], T * hidden - part[:, 1]
    cols[:, C["sq_diff"]], cols[:, C["sq_ref"]], cols[:, C["cos1m_sum"]] = part[:, 2], part[:, 3], part[:, 4]
    if ts.ulp is not None:  # as summarize's torch path
        ulp = ts.ulp.numpy()
        cols[:, C["ulp_0"] :] = np.concatenate([cols[:, C["values"] : C["values"] + 1], ulp], axis=1) - np.concatenate(
            [ulp, np.zeros((L, 1))], axis=1
        )
    return SampleSums(key, cols, maxes, hist)


class Totals:
    """Running sums over samples (optionally weighted): the full diff's accumulator."""

    def __init__(self, n_layers: int) -> None:
        self.sums = np.zeros((n_layers, len(COLUMNS)))
        self.maxes = np.zeros((n_layers, len(MAXES)))
        self.hist = np.zeros((n_layers, N_BINS), dtype=np.int64)

    def add(self, s: SampleSums) -> None:
        self.sums += s.sums
        np.maximum(self.maxes, s.maxes, out=self.maxes)
        self.hist += s.hist


def cos_p01(hist: np.ndarray, tokens: float) -> float:
    """1st percentile of per-token cosine: upper edge of the bin holding the 99th percentile of 1-cos."""
    if tokens <= 0:
        return 1.0
    target = math.ceil(0.99 * tokens)
    idx = int(np.searchsorted(np.cumsum(hist), target))
    if idx == 0:
        return 1.0
    return 1.0 - float(EDGES[min(idx, len(EDGES) - 1)])


def layer_stats(sums: np.ndarray, maxes: np.ndarray, hist: np.ndarray, ulps: bool) -> dict[str, Any]:
    """The reported statistics of one layer from its sums ``[len(COLUMNS)]``, maxima and histogram."""
    s = {name: float(sums[i]) for name, i in C.items()}
    n = max(1.0, s["values"])
    out: dict[str, Any] = {
        "tokens": int(round(s["tokens"])),
        "mean_abs": s["sum_abs"] / n,
        "max_abs": float(maxes[M["max_abs"]]),
        "rel_l2": math.sqrt(s["sq_diff"] / s["sq_ref"]) if s["sq_ref"] > 0 else 0.0,
        "cos_mean": 1.0 - s["cos1m_sum"] / max(1.0, s["tokens"]),
        "cos_min": 1.0 - float(maxes[M["cos1m_max"]]),
        "cos_p01": cos_p01(hist, s["tokens"]),
        "bit_exact": s["exact"] / n,
    }
    if ulps:
        counts = [s[f"ulp_{b}"] for b in ULP_BUCKETS]
        total = max(1.0, sum(counts))
        out["ulp_distribution"] = {b: c / total for b, c in zip(ULP_BUCKETS, counts)}
    return out


def verdict(ratio: float, dtype: str, noise_factor: float) -> str:
    if ratio <= noise_factor:
        return f"within precision noise ({ratio:.2f}x the {dtype} floor)"
    return f"beyond precision noise ({ratio:.1f}x the {dtype} floor)"

"""Streaming divergence statistics between two sets of hidden states (pure math, bounded memory).

One ``LayerDivergence`` per layer takes ``[T, H]`` pairs sample by sample and keeps only running sums,
a max, and a fixed log-scale histogram of per-token (1 - cosine), from which the 1st percentile of
cosine is read (accurate to one bin, ~1% relative). Memory does not grow with the number of samples.
"""

from __future__ import annotations

import math
from typing import Any

import torch

_EDGES = torch.logspace(-12, math.log10(2.0), 1201, dtype=torch.float64)  # bins of (1 - cos)
ULP_BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16")
_ULP_EDGES = torch.tensor([0, 1, 2, 4, 8, 16], dtype=torch.int64)


def bf16_ordered(x: torch.Tensor) -> torch.Tensor:
    """bf16 values as integers whose order and differences count ULPs (sign-magnitude -> two's complement)."""
    bits = x.contiguous().view(torch.int16).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


class LayerDivergence:
    def __init__(self, ulps: bool, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.n_tokens = 0
        self.n_values = 0
        self.sum_abs = 0.0
        self.max_abs = 0.0
        self.sum_sq_diff = 0.0
        self.sum_sq_ref = 0.0
        self.cos_sum = 0.0
        self.cos_min = 1.0
        self.bit_exact = 0
        self.hist = torch.zeros(len(_EDGES) + 1, dtype=torch.int64)
        self.ulp = torch.zeros(len(ULP_BUCKETS), dtype=torch.int64) if ulps else None

    def add(self, a: torch.Tensor, b: torch.Tensor) -> float:
        """Add one sample's ``[T, H]`` states (B is the reference); returns this sample's rel-L2."""
        if a.numel() == 0:
            return 0.0
        a, b = a.to(self.device, non_blocking=True), b.to(self.device, non_blocking=True)
        self.bit_exact += int((a == b).sum()) if a.dtype == b.dtype else int((a.float() == b.float()).sum())
        if self.ulp is not None:
            d = (bf16_ordered(a) - bf16_ordered(b)).abs()
            idx = torch.bucketize(d, _ULP_EDGES.to(self.device), right=False)
            self.ulp += torch.bincount(idx.flatten(), minlength=len(ULP_BUCKETS))[: len(ULP_BUCKETS)].cpu()
        a64, b64 = a.double(), b.double()
        d = a64 - b64
        sq_d, sq_b = float((d * d).sum()), float((b64 * b64).sum())
        self.sum_abs += float(d.abs().sum())
        self.max_abs = max(self.max_abs, float(d.abs().max()))
        self.sum_sq_diff += sq_d
        self.sum_sq_ref += sq_b
        na, nb = a64.norm(dim=1), b64.norm(dim=1)
        denom = na * nb
        cos = torch.where(denom > 0, (a64 * b64).sum(dim=1) / denom.clamp_min(1e-300),
                          (na == nb).double())  # two zero vectors agree; one zero vector does not
        cos = cos.clamp(-1.0, 1.0)
        self.cos_sum += float(cos.sum())
        self.cos_min = min(self.cos_min, float(cos.min()))
        edges = _EDGES.to(self.device)
        self.hist += torch.bincount(torch.bucketize(1.0 - cos, edges), minlength=len(_EDGES) + 1).cpu()
        self.n_tokens += a.shape[0]
        self.n_values += a.numel()
        return math.sqrt(sq_d / sq_b) if sq_b > 0 else (0.0 if sq_d == 0 else math.inf)

    def cos_p01(self) -> float:
        """1st percentile of per-token cosine (upper edge of the bin holding the 99th pct of 1-cos)."""
        if self.n_tokens == 0:
            return 1.0
        target = math.ceil(0.99 * self.n_tokens)
        idx = int(torch.searchsorted(torch.cumsum(self.hist, 0), torch.tensor(target)))
        if idx == 0:
            return 1.0
        return 1.0 - float(_EDGES[min(idx, len(_EDGES) - 1)])

    def result(self) -> dict[str, Any]:
        n = max(1, self.n_values)
        out: dict[str, Any] = {
            "tokens": self.n_tokens,
            "mean_abs": self.sum_abs / n,
            "max_abs": self.max_abs,
            "rel_l2": math.sqrt(self.sum_sq_diff / self.sum_sq_ref) if self.sum_sq_ref > 0 else 0.0,
            "cos_mean": self.cos_sum / max(1, self.n_tokens),
            "cos_min": self.cos_min,
            "cos_p01": self.cos_p01(),
            "bit_exact": self.bit_exact / n,
        }
        if self.ulp is not None:
            total = max(1, int(self.ulp.sum()))
            out["ulp_distribution"] = {k: int(v) / total for k, v in zip(ULP_BUCKETS, self.ulp.tolist())}
        return out


def verdict(ratio: float, dtype: str, noise_factor: float) -> str:
    if ratio <= noise_factor:
        return f"within precision noise ({ratio:.2f}x the {dtype} floor)"
    return f"beyond precision noise ({ratio:.1f}x the {dtype} floor)"

"""What one sample's stored states say against a live recomputation: the numbers the defect classifier
(``hsstore.compare.defects``) judges, computed on the device right after the forward.

Per stored layer (label i, ``[T, H]``): rows that are NaN, Inf, all zero or constant; the bit-exact
fraction against the live states at the recompute dtype; rel-L2 against the *truth* (the fp32 floor when
there is one, else the live states) of every live capture point j = 0..L (output of decoder layer j;
L = after the final norm) with that capture point's precision noise (rel-L2 of the live states at the
recompute dtype against the floor); rel-L2 with the rows shifted by k tokens; which rows are beyond noise
(and their bytes' hashes, for the stale-slot search across samples); and rel-L2 of each aux layer against
the stored target layer. Every rel-L2 is over the finite rows only (NaN/Inf rows are named, not averaged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import xxhash

SHIFTS = (1, 2, 3, -1, -2, -3)  # token shifts tried: row t holds the truth of row t - k
ROW_SLACK = 4.0  # a row is "beyond noise" above this multiple of max(its own noise, the layer's)


@dataclass
class LayerEvidence:
    """The evidence of one stored layer of one sample (rows are indices into the sample's tokens)."""

    label: int
    rows: int
    nan_rows: list[int]
    inf_rows: list[int]
    zero_rows: list[int]
    const_rows: list[int]
    bit_exact: float  # against the live states at the recompute dtype (nan: no such live layer)
    rel: float  # against the truth of the same capture point (nan: label beyond the model's layers)
    noise: float | None  # that capture point's precision noise (None: no floor)
    rel_by_point: dict[int, float] = field(default_factory=dict)
    noise_by_point: dict[int, float] = field(default_factory=dict)
    rel_shifted: dict[int, float] = field(default_factory=dict)
    bad_rows: list[int] = field(default_factory=list)  # finite rows beyond noise (without a floor: not bit-exact)
    bad_row_hashes: dict[int, int] = field(default_factory=dict)
    rel_to_target: float | None = None  # aux layers: against the stored target layer


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


def row_hash(row: torch.Tensor) -> int:
    """xxh3_64 of one row's bytes (as stored)."""
    return xxhash.xxh3_64_intdigest(row.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def health_rows(s: torch.Tensor) -> tuple[list[int], list[int], list[int], list[int]]:
    """Indices of rows with a NaN, with an Inf (and no NaN), all zero, constant (not zero)."""
    f = s.float()
    nan = torch.isnan(f).any(1)
    inf = torch.isinf(f).any(1) & ~nan
    finite = ~(nan | inf)
    zero = finite & (f == 0).all(1)
    const = finite & ~zero & (f.amax(1) == f.amin(1))
    return [torch.nonzero(m).flatten().tolist() for m in (nan, inf, zero, const)]


def sample_evidence(stored: dict[int, torch.Tensor], live: dict[int, torch.Tensor],
                    floor: dict[int, torch.Tensor] | None, target: int | None, noise_factor: float) -> list[LayerEvidence]:
    """Evidence for every stored layer of one sample: ``stored`` label -> ``[T, H]``, ``live`` and
    ``floor`` capture point -> ``[T, H]`` (all on one device), ``target`` the stored target label."""
    truth = floor if floor is not None else live
    points = sorted(live)
    noise = {j: rel_l2(live[j], floor[j]) for j in points} if floor is not None else {}
    out = []
    for label, s in stored.items():
        nan_rows, inf_rows, zero_rows, const_rows = health_rows(s)
        finite = torch.ones(s.shape[0], dtype=torch.bool, device=s.device)
        finite[nan_rows + inf_rows] = False
        sf = s[finite]
        ev = LayerEvidence(label, int(s.shape[0]), nan_rows, inf_rows, zero_rows, const_rows, math.nan, math.nan,
                           noise.get(label) if floor is not None else None)
        ev.rel_by_point = {j: rel_l2(sf, truth[j][finite]) for j in points}
        ev.noise_by_point = dict(noise)
        if label in live:
            # a count, not .mean(): CUDA's mean multiplies by 1/N, so all-equal reads 0.99999994 there
            ev.bit_exact = int((s == live[label].to(s.dtype)).sum()) / max(1, s.numel())
            ev.rel = ev.rel_by_point[label]
            t = truth[label]
            for k in SHIFTS:
                if abs(k) < s.shape[0]:
                    a, b = (s[k:], t[:-k]) if k > 0 else (s[:k], t[-k:])
                    ok = torch.isfinite(a.float()).all(1)
                    ev.rel_shifted[k] = rel_l2(a[ok], b[ok])
            ev.bad_rows = _bad_rows(s, live[label], floor[label] if floor is not None else None, finite,
                                    ev.noise, noise_factor)
            ev.bad_row_hashes = {r: row_hash(s[r]) for r in ev.bad_rows}
        if target is not None and label != target and target in stored:
            ok = finite & torch.isfinite(stored[target].float()).all(1)
            ev.rel_to_target = rel_l2(s[ok], stored[target][ok])
        out.append(ev)
    return out


def _bad_rows(s: torch.Tensor, live: torch.Tensor, floor: torch.Tensor | None, finite: torch.Tensor,
              noise: float | None, noise_factor: float) -> list[int]:
    """Finite rows beyond noise: above ROW_SLACK x noise_factor x max(the row's own noise, the layer's)."""
    if floor is None:
        differs = (s != live.to(s.dtype)).any(1)
        return torch.nonzero(differs & finite).flatten().tolist()
    r = row_rel(s, floor)
    own = row_rel(live, floor)
    bound = ROW_SLACK * noise_factor * torch.clamp(own, min=noise or 0.0)
    return torch.nonzero((r > bound) & finite).flatten().tolist()

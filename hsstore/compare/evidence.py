"""What one sample's stored states say against a live recomputation: the numbers the defect classifier
(``hsstore.compare.defects``) judges, computed on the device right after the forward.

Per stored layer (label i, ``[T, H]``): rows that are NaN, Inf, all zero or constant; the bit-exact
fraction against the live states at the recompute dtype; rel-L2 against the *truth* (the fp32 floor when
there is one, else the live states) of every live capture point j = 0..L (output of decoder layer j;
L = after the final norm) with that capture point's precision noise (rel-L2 of the live states at the
recompute dtype against the floor); rel-L2 with the rows shifted by k tokens (k = ±1..3, and the shifts
that a few probe rows' nearest truth rows point at, so a shift by any k is seen); which rows are beyond
noise (and their bytes' hashes, for the stale-slot search across samples); and rel-L2 of each aux layer
against the stored target layer. Every rel-L2 is over the healthy rows only: NaN/Inf, zero and constant
rows are named, not averaged, so what the other rows hold is judged too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import xxhash

from hsstore.compare.distance import coherent_difference, rel_l2, row_rel
from hsstore.compare.transforms import transform_fits

SHIFTS = (1, 2, 3, -1, -2, -3)  # token shifts always tried: row t holds the truth of row t - k
PROBES = 8  # rows whose nearest truth row proposes a further shift
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
    transforms: dict[str, tuple[float, str]] = field(default_factory=dict)  # beyond noise: rel-L2 with a value bug undone
    noise_like: bool = False  # beyond noise: the difference is incoherent across rows of one token (noise added)


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
                    floor: dict[int, torch.Tensor] | None, target: int | None, noise_factor: float,
                    tokens: torch.Tensor | None = None) -> list[LayerEvidence]:
    """Evidence for every stored layer of one sample: ``stored`` label -> ``[T, H]``, ``live`` and
    ``floor`` capture point -> ``[T, H]`` (all on one device; a stored floor holds only its own layers: the
    other points have no noise and are matched by margin), ``target`` the stored target label, ``tokens``
    the sample's token ids ``[T]``."""
    floor = floor or {}
    points = sorted(live)
    truth = {j: floor.get(j, live[j]) for j in points}
    noise = {j: rel_l2(live[j], floor[j]) for j in points if j in floor}
    out = []
    for label, s in stored.items():
        nan_rows, inf_rows, zero_rows, const_rows = health_rows(s)
        healthy = torch.ones(s.shape[0], dtype=torch.bool, device=s.device)
        healthy[nan_rows + inf_rows + zero_rows + const_rows] = False
        sf = s[healthy]
        ev = LayerEvidence(label, int(s.shape[0]), nan_rows, inf_rows, zero_rows, const_rows, math.nan, math.nan,
                           noise.get(label))
        ev.rel_by_point = {j: rel_l2(sf, truth[j][healthy]) for j in points}
        ev.noise_by_point = dict(noise)
        if label in live:
            # a count, not .mean(): CUDA's mean multiplies by 1/N, so all-equal reads 0.99999994 there
            ev.bit_exact = int((s == live[label].to(s.dtype)).sum()) / max(1, s.numel())
            ev.rel = ev.rel_by_point[label]
            t = truth[label]
            wrong = not (ev.bit_exact == 1.0 or (ev.noise is not None and ev.rel <= noise_factor * ev.noise))
            for k in SHIFTS + (probe_shifts(s, t, healthy) if wrong else ()):
                if 0 < abs(k) < s.shape[0] and k not in ev.rel_shifted:
                    a, b, ok = (s[k:], t[:-k], healthy[k:]) if k > 0 else (s[:k], t[-k:], healthy[:k])
                    ev.rel_shifted[k] = rel_l2(a[ok], b[ok])
            if wrong:
                ev.transforms = transform_fits(s, t, healthy, ev.noise, noise_factor)
                if tokens is not None:
                    ev.noise_like = coherent_difference((s.float() - t.float())[healthy], tokens[healthy]) is False
            ev.bad_rows = _bad_rows(s, live[label], floor.get(label), healthy,
                                    ev.noise, noise_factor)
            ev.bad_row_hashes = {r: row_hash(s[r]) for r in ev.bad_rows}
        if target is not None and label != target and target in stored:
            ok = healthy & torch.isfinite(stored[target].float()).all(1)
            ev.rel_to_target = rel_l2(s[ok], stored[target][ok])
        out.append(ev)
    return out


def probe_shifts(s: torch.Tensor, truth: torch.Tensor, healthy: torch.Tensor) -> tuple[int, ...]:
    """Shifts k (row r holds the truth of row r - k) proposed by PROBES healthy rows spread over the sample:
    each row's nearest truth row by relative distance; a shift two or more probes agree on."""
    rows = torch.nonzero(healthy).flatten()
    if rows.numel() < 2:
        return ()
    pick = rows[torch.linspace(0, rows.numel() - 1, min(PROBES, rows.numel())).round().long()]
    t = truth.double()
    d = torch.cdist(s[pick].double(), t) / torch.linalg.vector_norm(t, dim=1).clamp_min(1e-300)  # [probes, T]
    ks = (pick - d.argmin(1)).tolist()
    return tuple(sorted({k for k in ks if k != 0 and ks.count(k) >= 2}))


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

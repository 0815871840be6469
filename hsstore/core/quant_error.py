"""How far stored (quantized) states are from the states as computed: additive statistics per layer.

``error_tensor`` runs where the states are (on a GPU: no host sync; it travels to the host with the
unit it describes), ``from_error_tensor`` makes the additive record a commit keeps, ``merge`` adds
records of many units and ``summary`` gives rel-L2, per-token cosine (mean, min) and the largest
absolute error. Per-unit sums are float64 on a GPU and cascaded float32 on the CPU (~1e-7 relative,
far below the ~1e-2 errors measured); records add in float64.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from hsstore.core.schema.storage_report import StorageError

FIELDS = ("tokens", "sum_sq_err", "sum_sq_ref", "cos_sum", "cos_min", "max_abs")


def error_tensor(ref: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """``[tokens, sum (s-r)^2, sum r^2, sum of per-token cosine, min cosine, max |s-r|]`` (float64,
    on the states' device) of ``stored`` against ``ref``, both ``[T, H]``. Non-finite values count as 0."""
    r = torch.nan_to_num(ref.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    s = torch.nan_to_num(stored.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    if r.shape[0] == 0:
        return torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64, device=r.device)
    d = s - r
    acc = None if r.device.type == "cpu" else torch.float64  # CPU float32 sums are cascaded (accurate), fast
    nr, ns = torch.linalg.vector_norm(r, dim=1), torch.linalg.vector_norm(s, dim=1)
    denom = nr * ns
    # two zero rows agree (cosine 1); a zero row against a non-zero one does not (0)
    cos = torch.where(denom > 0, (r * s).sum(dim=1) / denom.clamp_min(1e-30), (nr == ns).float()).clamp(-1, 1)
    return torch.stack([
        r.new_full((), float(r.shape[0]), dtype=torch.float64),  # a fill, not a copy (which would sync)
        torch.linalg.vector_norm(d, dtype=acc).double().square(), torch.linalg.vector_norm(r, dtype=acc).double().square(),
        cos.sum(dtype=acc).double(), cos.min().double(), d.abs().amax().double(),
    ])


def from_error_tensor(values: list[float]) -> dict[str, float]:
    """The additive record of one unit and layer from ``error_tensor(...).tolist()``."""
    out = dict(zip(FIELDS, values))
    out["tokens"] = int(out["tokens"])
    return out


def merge(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """One record from many (sums add; minimum cosine and maximum error are kept)."""
    out: dict[str, float] = {"tokens": 0, "sum_sq_err": 0.0, "sum_sq_ref": 0.0, "cos_sum": 0.0,
                             "cos_min": 1.0, "max_abs": 0.0}
    for p in parts:
        for k in ("tokens", "sum_sq_err", "sum_sq_ref", "cos_sum"):
            out[k] += p[k]
        out["cos_min"] = min(out["cos_min"], p["cos_min"])
        out["max_abs"] = max(out["max_abs"], p["max_abs"])
    return out


def summary(e: Mapping[str, float]) -> StorageError:
    """rel-L2 (||stored - ref|| / ||ref|| over all values), cosine mean and min per token, max abs error."""
    ref = e["sum_sq_ref"]
    rel = math.sqrt(e["sum_sq_err"] / ref) if ref > 0 else (0.0 if e["sum_sq_err"] == 0 else math.inf)
    return StorageError(tokens=int(e["tokens"]), rel_l2=rel, cos_mean=e["cos_sum"] / max(1, e["tokens"]),
                        cos_min=e["cos_min"], max_abs=e["max_abs"])

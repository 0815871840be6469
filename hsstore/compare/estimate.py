"""From per-sample sums to reported layers and a verdict: full sums, or sampled ones with intervals."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hsstore.compare.divergence import Totals, layer_stats, verdict
from hsstore.compare.sampling import (BOOTSTRAP, Choice, SampleTable, interval, percentile_interval, ratio_stats,
                                      replicate_weights)
from hsstore.core.dtypes import UNIT_ROUNDOFF
from hsstore.core.schema.diff_report import LayerDiff

CI_STATS = ("mean_abs", "rel_l2", "cos_mean", "cos_p01", "bit_exact")


@dataclass
class Estimate:
    """Reported layers, and for a sampled diff the bootstrap replicates of rel-L2 ``[R, L]``."""

    layers: list[LayerDiff]
    rel_l2_replicates: np.ndarray | None = None
    df: float = 0.0  # degrees of freedom of the intervals (samples - strata)


def full_layers(layers: list[int], totals: Totals, ulps: bool) -> Estimate:
    return Estimate([LayerDiff(layer=i, **layer_stats(totals.sums[j], totals.maxes[j], totals.hist[j], ulps))
                     for j, i in enumerate(layers)])


def sampled_layers(layers: list[int], table: SampleTable, choice: Choice, ulps: bool, confidence: float,
                   seed: int) -> Estimate:
    """Point estimates (stratum-weighted) with bootstrap intervals over samples."""
    sums, hist = table.weighted(choice.weights[None, :])
    maxes = np.max(np.stack(table.maxes), axis=0)
    reps = replicate_weights(choice, BOOTSTRAP, seed)
    rsums, rhist = table.weighted(reps)
    rstats = ratio_stats(rsums, rhist)  # each [R, L]
    df = len(choice.indices) - len(choice.population)
    out = []
    for j, i in enumerate(layers):
        stats = layer_stats(sums[0, j], maxes[j], hist[0, j], ulps)
        ci = {name: interval(stats[name], rstats[name][:, j], confidence, df) for name in CI_STATS if name != "cos_p01"}
        ci["cos_p01"] = percentile_interval(rstats["cos_p01"][:, j], confidence)
        out.append(LayerDiff(layer=i, ci=ci, **stats))
    return Estimate(out, rstats["rel_l2"], df)


def with_floor(est: Estimate, floor: Estimate, dtype: str, noise_factor: float,
               confidence: float) -> tuple[list[LayerDiff], str, str]:
    """Layers with floor ratios and verdicts, the overall verdict and its kind
    (identical | within_noise | beyond_noise | inconclusive)."""
    out = []
    ratio_reps = None
    if est.rel_l2_replicates is not None and floor.rel_l2_replicates is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_reps = est.rel_l2_replicates / floor.rel_l2_replicates
    for j, (L, F) in enumerate(zip(est.layers, floor.layers)):
        ratio = L.rel_l2 / F.rel_l2 if F.rel_l2 > 0 else (0.0 if L.rel_l2 == 0 else float("inf"))
        v = "identical (bit-exact)" if L.bit_exact == 1.0 else verdict(ratio, dtype, noise_factor)
        extra = {}
        if ratio_reps is not None:
            extra["ci"] = {**L.ci, "floor_ratio": interval(ratio, ratio_reps[:, j], confidence, est.df)}
        out.append(L.replace(floor_rel_l2=F.rel_l2, floor_ratio=ratio, verdict=v, **extra))
    worst = max(out, key=lambda L: L.floor_ratio)
    worst_ratio = max(0.0, worst.floor_ratio)
    within = worst_ratio <= noise_factor
    kind = "within_noise" if within else "beyond_noise"
    span = ""
    if ratio_reps is not None:
        lo, hi = worst.ci["floor_ratio"]
        span = f", {confidence:.0%} interval {lo:.2f}-{hi:.2f}x"
        if any(L.ci["floor_ratio"][0] <= noise_factor < L.ci["floor_ratio"][1] for L in out):
            kind = "inconclusive"
    text = (f"A and B differ {'within' if within else 'beyond'} precision noise: worst layer {worst.layer} at "
            f"{worst_ratio:.2f}x the floor{span} (noise up to {noise_factor:g}x)")
    if kind == "inconclusive":
        text += "; not settled at this sample size (an interval straddles the bound): raise --samples"
    return out, text, kind


def without_floor(est: Estimate, dtype: str) -> tuple[list[LayerDiff], str]:
    u = UNIT_ROUNDOFF.get(dtype)
    out = [L.replace(roundoff_ratio=L.rel_l2 / u) if u else L for L in est.layers]
    worst = max(out, key=lambda L: L.rel_l2)
    scale = f" = {worst.roundoff_ratio:.1f}x the {dtype} unit roundoff" if u else ""
    return out, (f"no floor given (pass --floor STORE#fp32-variant for a verdict); worst rel-L2 "
                 f"{worst.rel_l2:.3g} at layer {worst.layer}{scale}")

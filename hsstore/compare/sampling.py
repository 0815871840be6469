"""Sampled diffs and audits: a seeded choice of samples stratified by length, and what the choice bounds
(confidence intervals; a defect rate).

Choice: the shared samples sorted by (length, key) are cut into strata of equal count; each stratum
gets its proportional share of the n samples (at least 2, so its variance can be estimated) drawn
without replacement by ``numpy.random.default_rng(seed)``. The same keys and seed give the same choice.

Estimates: every reported statistic is a function of per-sample sums (``kernel``), so the point
estimate weights each chosen sample by N_h / n_h (its stratum's population over its sample count) —
a stratified ratio estimator (e.g. rel-L2 = sqrt(sum w·|d|² / sum w·|b|²)).

Intervals: Rao-Wu rescaling bootstrap over samples within strata (``BOOTSTRAP`` replicates, percentile
intervals). Why a bootstrap rather than the delta method: the statistics are nonlinear (a square root
of a ratio; the floor ratio is a ratio of two such, computed on the same samples; the 1st percentile of
cosine is a quantile), per-sample contributions are heavy-tailed (one long or broken sample can carry a
layer), and resampling whole samples keeps the strong correlation of tokens within a sample. Rao-Wu
draws n_h - 1 of n_h with replacement and rescales, which keeps the variance right for small strata and
applies the finite-population correction (an interval shrinks to the point as the fraction nears 1).
Maxima (max |d|, min cosine) have no interval: the sampled value bounds the store's from one side.

Audits: the same choice picks the samples an audit checks (``choose_keys``), and k defective of n chosen
samples bound the variant's defect rate (``rate_bound``: a one-sided Clopper-Pearson bound, ``upper_bound``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from hsstore.compare.kernel import N_BINS, C, SampleSums, Totals, cos_p01, layer_stats, verdict
from hsstore.core.dtypes import UNIT_ROUNDOFF
from hsstore.core.errors import BadInput
from hsstore.core.schema.reports import LayerDiff, Sampling
from hsstore.storage.reader import VariantReader

BOOTSTRAP = 1000
MAX_STRATA = 10
MIN_PER_STRATUM = 5  # samples per stratum: fewer leave its variance estimate too coarse to trust
CHUNK = 512  # samples per dense histogram block in the bootstrap


@dataclass(frozen=True)
class Choice:
    """Chosen samples (indices into the shared keys, in their order), their weights and strata."""

    indices: np.ndarray
    weights: np.ndarray  # N_h / n_h of each chosen sample
    strata: np.ndarray  # stratum of each chosen sample
    population: np.ndarray  # N_h
    sampled: np.ndarray  # n_h


def sample_count(population: int, samples: int | None, fraction: float | None) -> int:
    """How many samples to compare: at least 2 (one sample has no variance to estimate an interval from)."""
    n = samples if samples is not None else math.ceil((fraction or 1.0) * population)
    return max(min(2, population), min(population, n))


def choose(lengths: Sequence[int], keys: Sequence[str], n: int, seed: int) -> Choice:
    """A seeded, length-stratified choice of ``n`` of the samples."""
    N = len(lengths)
    order = sorted(range(N), key=lambda i: (lengths[i], keys[i]))
    n_strata = max(1, min(MAX_STRATA, n // MIN_PER_STRATUM))
    bounds = [round(h * N / n_strata) for h in range(n_strata + 1)]
    pops = np.diff(bounds)
    alloc = _allocate(pops, n)
    rng = np.random.default_rng(seed)
    idx, w, st = [], [], []
    for h in range(n_strata):
        members = order[bounds[h] : bounds[h + 1]]
        picked = rng.choice(len(members), size=alloc[h], replace=False)
        idx += [members[int(p)] for p in picked]
        w += [pops[h] / alloc[h]] * int(alloc[h])
        st += [h] * int(alloc[h])
    o = np.argsort(idx, kind="stable")
    return Choice(np.asarray(idx)[o], np.asarray(w, dtype=float)[o], np.asarray(st)[o], pops, alloc)


def _allocate(pops: np.ndarray, n: int) -> np.ndarray:
    """Proportional allocation of ``n`` over strata of ``pops``, at least min(2, N_h) each."""
    share = pops * n / pops.sum()
    alloc: np.ndarray = np.minimum(pops, np.maximum(np.minimum(2, pops), np.floor(share))).astype(int)
    while alloc.sum() < n:  # largest remainders first, never above a stratum's population
        room = np.where(alloc < pops, share - alloc, -np.inf)
        alloc[int(np.argmax(room))] += 1
    while alloc.sum() > n:
        room = np.where(alloc > np.minimum(2, pops), alloc - share, -np.inf)
        alloc[int(np.argmax(room))] -= 1
    return alloc


def replicate_weights(choice: Choice, replicates: int, seed: int) -> np.ndarray:
    """Rao-Wu rescaled bootstrap weights ``[replicates, n]`` (each row: one replicate's weights)."""
    rng = np.random.default_rng([seed, 1])
    out = np.tile(choice.weights, (replicates, 1))
    for h, (N_h, n_h) in enumerate(zip(choice.population, choice.sampled)):
        if n_h < 2:
            continue  # a stratum of one sample carries no variance estimate: held fixed
        cols = np.flatnonzero(choice.strata == h)
        m = n_h - 1
        lam = math.sqrt(m * (1 - n_h / N_h) / (n_h - 1))
        draws = rng.integers(0, n_h, size=(replicates, m))
        counts = np.zeros((replicates, n_h))
        np.add.at(counts, (np.arange(replicates)[:, None], draws), 1)
        out[:, cols] *= 1 - lam + lam * (n_h / m) * counts
    return out


class SampleTable:
    """Per-sample sums of the chosen samples (sums dense, histograms sparse: O(samples) memory)."""

    def __init__(self) -> None:
        self.sums: list[np.ndarray] = []
        self.hists: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self.maxes: list[np.ndarray] = []

    def add(self, s: SampleSums) -> None:
        self.sums.append(s.sums)
        self.maxes.append(s.maxes)
        self.hists.append([(np.flatnonzero(h), h[h > 0]) for h in s.hist])

    def weighted(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sums ``[R, L, K]`` and histograms ``[R, L, N_BINS]`` under ``weights [R, n]``."""
        sums = np.einsum("rn,nlk->rlk", weights, np.stack(self.sums))
        n_layers = self.sums[0].shape[0]
        hist = np.zeros((weights.shape[0], n_layers, N_BINS))
        for c0 in range(0, len(self.hists), CHUNK):
            block = np.zeros((min(CHUNK, len(self.hists) - c0), n_layers, N_BINS))
            for i, layers in enumerate(self.hists[c0 : c0 + CHUNK]):
                for j, (bins, counts) in enumerate(layers):
                    block[i, j, bins] = counts
            hist += np.einsum("rn,nlb->rlb", weights[:, c0 : c0 + CHUNK], block)
        return sums, hist


def ratio_stats(sums: np.ndarray, hist: np.ndarray) -> dict[str, np.ndarray]:
    """The interval-bearing statistics from weighted sums ``[..., K]`` and histograms ``[..., N_BINS]``."""
    s = {name: sums[..., i] for name, i in C.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {
            "mean_abs": s["sum_abs"] / s["values"],
            "rel_l2": np.sqrt(s["sq_diff"] / s["sq_ref"]),
            "cos_mean": 1.0 - s["cos1m_sum"] / s["tokens"],
            "bit_exact": s["exact"] / s["values"],
        }
    flat_h, flat_t = hist.reshape(-1, hist.shape[-1]), s["tokens"].reshape(-1)
    out["cos_p01"] = np.array([cos_p01(h, t) for h, t in zip(flat_h, flat_t)]).reshape(s["tokens"].shape)
    return out


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile (Cornish-Fisher expansion, Abramowitz & Stegun 26.7.5; ~1e-3 for df >= 3)."""
    z = NormalDist().inv_cdf(p)
    df = max(df, 1.0)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def interval(point: float, replicates: np.ndarray, confidence: float, df: float) -> tuple[float, float]:
    """``point`` +- t(df) x the bootstrap standard error, on a log scale for positive statistics
    (rel-L2 and friends are ratios: skewed, bounded below by 0). Percentile intervals of a bootstrap
    under-cover with few samples (90% for a nominal 95% at 10-20 samples in tests); the t quantile
    with df = samples - strata widens them as the sample shrinks."""
    v = replicates[np.isfinite(replicates)]
    if v.size < 2 or not math.isfinite(point):
        return (point, point)
    t = t_quantile((1 + confidence) / 2, df)
    if point > 0 and np.all(v > 0):
        se = float(np.std(np.log(v), ddof=1))
        return (point * math.exp(-t * se), point * math.exp(t * se))
    se = float(np.std(v, ddof=1))
    return (point - t * se, point + t * se)


def percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval (for a quantile such as the 1st percentile of cosine, read from bins)."""
    v = replicates[np.isfinite(replicates)]
    if v.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.quantile(v, [(1 - confidence) / 2, (1 + confidence) / 2])
    return (float(lo), float(hi))


__all__ = [
    "BOOTSTRAP",
    "Choice",
    "SampleTable",
    "choose",
    "interval",
    "percentile_interval",
    "ratio_stats",
    "replicate_weights",
    "sample_count",
    "t_quantile",
]


# --- Which shared samples a sampled diff reads (``--samples N`` / ``--fraction F``), and how it says so.


@dataclass(frozen=True)
class SamplePlan:
    keys: list[str]  # chosen, in the shared keys' order
    choice: Choice
    record: Sampling


def check_sampling(samples: int | None, fraction: float | None, confidence: float) -> None:
    if samples is not None and fraction is not None:
        raise BadInput("pass --samples N or --fraction F, not both")
    if samples is not None and samples < 1:
        raise BadInput(f"--samples {samples}: must be 1 or more")
    if fraction is not None and not 0 < fraction <= 1:
        raise BadInput(f"--fraction {fraction}: must be in (0, 1], e.g. 0.01 for 1% of the shared samples")
    if not 0 < confidence < 1:
        raise BadInput(f"--confidence {confidence}: must be in (0, 1), e.g. 0.95")


def plan_samples(
    a: VariantReader,
    b: VariantReader,
    c: VariantReader | None,
    keys: Sequence[str],
    samples: int | None,
    fraction: float | None,
    seed: int,
    confidence: float,
) -> SamplePlan | None:
    """None for a full diff; else the seeded, length-stratified choice among the shared samples (shared
    with the floor too, when there is one: A against B and against C are read on the same samples)."""
    check_sampling(samples, fraction, confidence)
    if samples is None and fraction is None:
        return None
    population, notes = _eligible(keys, c)
    n = sample_count(len(population), samples, fraction)
    choice = choose([a.refs[k].length for k in population], population, n, seed)
    chosen = [population[int(i)] for i in choice.indices]
    if len(chosen) < 10:
        notes.append(
            f"only {len(chosen)} samples: the intervals are wide and approximate (t with "
            f"{len(chosen) - len(choice.population)} degree(s) of freedom)"
        )
    notes += [
        "max_abs and cos_min are over the sampled tokens: they bound the store's from below "
        "(max_abs) and above (cos_min); they have no interval",
        "worst_samples lists the worst of the sampled samples",
    ]
    record = Sampling(
        method=f"length-stratified random choice without replacement ({len(choice.population)} strata of equal "
        "count by sample length, proportional allocation, at least 2 per stratum), stratum-weighted "
        "ratio estimators",
        seed=seed,
        population=len(population),
        samples=len(chosen),
        fraction=len(chosen) / len(population),
        strata=len(choice.population),
        confidence=confidence,
        interval=f"Rao-Wu rescaling bootstrap over samples within strata, {BOOTSTRAP} replicates, percentile",
        notes=notes,
    )
    return SamplePlan(chosen, choice, record)


def _eligible(keys: Sequence[str], c: VariantReader | None) -> tuple[list[str], list[str]]:
    """(the samples a sampled diff chooses among, notes): those A and B share, less those the floor (when there
    is one) lacks, with a note of how many that left out; BadInput when the floor shares none."""
    notes = []
    population = list(keys)
    if c is not None:
        population = [k for k in keys if k in c.refs]
        if len(population) < len(keys):
            notes.append(
                f"{len(keys) - len(population)} sample(s) shared by A and B are not in the floor and were not eligible"
            )
        if not population:
            raise BadInput(
                f"the floor {c.id} shares no samples with A and B; a sampled diff reads all three on the same samples"
            )
    return population, notes


# --- Which samples an audit checks, and what they say of the variant: a seeded, length-stratified draw
# (``--samples``/``--fraction``: each sample's chance about n/N, so k defective of n bound the defect rate),
# every sample (the rate itself), or samples the user names by key (``--keys``: not a draw, no bound).

CONFIDENCE = 0.95
DEFAULT_SAMPLES = 8


def choose_keys(
    reader: VariantReader, samples: int | None, fraction: float | None, seed: int, named: list[str] | None = None
) -> list[str]:
    """The samples named by key prefix (``--keys``), else a seeded, length-stratified choice of ``samples`` (or
    a ``fraction``; default 8; ``hsstore.compare.sampling``), in commit order."""
    keys = reader.keys
    if named is not None:
        if samples is not None or fraction is not None:
            raise BadInput("--keys names the samples: leave out --samples and --fraction")
        return named_keys(reader, named)
    N = len(keys)
    n = (
        min(N, samples)
        if samples is not None
        else max(1, math.ceil(fraction * N))
        if fraction
        else min(N, DEFAULT_SAMPLES)
    )
    choice = choose([reader.refs[k].length for k in keys], keys, n, seed)
    return [keys[int(i)] for i in choice.indices]


def named_keys(reader: VariantReader, prefixes: list[str]) -> list[str]:
    """The stored keys the prefixes name (each exactly one), in commit order; BadInput for one that names
    none or several."""
    prefixes = [p.strip().lower() for p in prefixes if p.strip()]
    if not prefixes:
        raise BadInput("--keys is empty: name samples by their keys (or unique prefixes), comma-separated")
    out = set()
    for p in prefixes:
        hits = [k for k in reader.keys if k.startswith(p)]
        if not hits:
            raise BadInput(
                f"no sample of variant {reader.id} has a key starting with {p!r} (hsstore verify and "
                "hsstore check --json name samples by key)"
            )
        if len(hits) > 1:
            raise BadInput(
                f"key prefix {p!r} matches {len(hits)} samples of variant {reader.id} ({hits[0][:16]}, "
                f"{hits[1][:16]}, ...): give more characters"
            )
        out.add(hits[0])
    return [k for k in reader.keys if k in out]


def rate_bound(k: int, n: int, N: int, named: bool) -> tuple[float | None, str]:
    """What k defective of n checked samples (of N) say of the variant's defect rate: (upper bound or the rate
    itself, in words); None for samples named by the user (not a random draw: they bound nothing)."""
    if named:
        return None, (
            f"{k} defective of the {n} sample(s) named (--keys), not drawn at random: they bound no rate "
            "(drop --keys for a seeded random choice that does)"
        )
    if n >= N:
        return k / N, f"every one of the {N} samples checked: {k} defective, a defect rate of {k / N:.3g} exactly"
    if k == n:
        return 1.0, (
            f"all {n} samples chosen at random (seeded, length-stratified) from {N} are defective: the "
            "defect rate may be anywhere up to 1"
        )
    upper = upper_bound(k, n, CONFIDENCE)
    return upper, (
        f"{k} defective of {n} samples chosen at random (seeded, length-stratified) from {N}: the "
        f"variant's defect rate is below {upper:.3g} at {CONFIDENCE:.0%} confidence"
        + (" (about 3/n: check more samples to bound it lower)" if not k else "")
    )


def upper_bound(defective: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a defect rate after ``defective`` of ``n`` random samples
    (0 of n: 1 - (1 - confidence)^(1/n), about 3/n at 95 %)."""
    if n <= 0:
        return 1.0
    if defective >= n:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = defective / n, 1.0
    for _ in range(100):  # bisection on P(X <= defective | p) = alpha
        mid = (lo + hi) / 2
        if _binom_cdf(defective, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def _binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0 if k < n else 1.0
    lp, lq = math.log(p), math.log1p(-p)
    return sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        for i in range(k + 1)
    )


# --- From per-sample sums to reported layers and a verdict: full sums, or sampled ones with intervals.

CI_STATS = ("mean_abs", "rel_l2", "cos_mean", "cos_p01", "bit_exact")


@dataclass
class Estimate:
    """Reported layers, and for a sampled diff the bootstrap replicates of rel-L2 ``[R, L]``."""

    layers: list[LayerDiff]
    rel_l2_replicates: np.ndarray | None = None
    df: float = 0.0  # degrees of freedom of the intervals (samples - strata)


def full_layers(layers: list[int], totals: Totals, ulps: bool) -> Estimate:
    return Estimate(
        [
            LayerDiff(layer=i, **layer_stats(totals.sums[j], totals.maxes[j], totals.hist[j], ulps))
            for j, i in enumerate(layers)
        ]
    )


def sampled_layers(
    layers: list[int], table: SampleTable, choice: Choice, ulps: bool, confidence: float, seed: int
) -> Estimate:
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


# what a comparison against a floor concludes (a bit-exact comparison needs no floor: "identical" is decided before)
FloorVerdictKind = Literal["within_noise", "beyond_noise", "inconclusive"]

# a floor this far from A (rel-L2) is no precision floor: rounding in any dtype moves states by a few percent even
# over 64 layers; half their norm is another computation, or a side all zeros (rel-L2 1: a broken extractor's)
FLOOR_NOT_NOISE = 0.5


def nan_last(x: float) -> float:
    """A sort key that ranks NaN below every number (a NaN compares False with all of them, so max would skip it)."""
    return -math.inf if math.isnan(x) else x


def with_floor(
    est: Estimate, floor: Estimate, dtype: str, noise_factor: float, confidence: float
) -> tuple[list[LayerDiff], str, FloorVerdictKind]:
    """Layers with floor ratios and verdicts, the overall verdict and its kind (within_noise | beyond_noise |
    inconclusive: only a sampled diff, whose estimates and floor both have replicates, has intervals)."""
    out: list[LayerDiff] = []
    ratios: list[float] = []  # each layer's floor_ratio ...
    ratio_cis: list[tuple[float, float]] = []  # ... and its interval (when both have replicates)
    undecided: list[str] = []  # the differing layers the floor cannot judge, and why
    ratio_reps = None
    if est.rel_l2_replicates is not None and floor.rel_l2_replicates is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_reps = est.rel_l2_replicates / floor.rel_l2_replicates
    for j, (L, F) in enumerate(zip(est.layers, floor.layers)):
        ratio = L.rel_l2 / F.rel_l2 if F.rel_l2 > 0 else (0.0 if L.rel_l2 == 0 else float("inf"))
        v = "identical (bit-exact)" if L.bit_exact == 1.0 else verdict(ratio, dtype, noise_factor)
        if L.bit_exact != 1.0 and (why := _undecidable(ratio, F.rel_l2)):
            v = f"no verdict: {why}"
            undecided.append(f"at layer {L.layer} {why}")
        extra: dict[str, dict[str, tuple[float, float]]] = {}
        if ratio_reps is not None:
            ratio_cis.append(interval(ratio, ratio_reps[:, j], confidence, est.df))
            extra["ci"] = {**(L.ci or {}), "floor_ratio": ratio_cis[-1]}  # (sampled layers have their ci)
        ratios.append(ratio)
        out.append(L.replace(floor_rel_l2=F.rel_l2, floor_ratio=ratio, verdict=v, **extra))
    w = max(range(len(out)), key=lambda i: nan_last(ratios[i]))  # the worst layer with a ratio (the first of equals)
    worst = out[w]
    worst_ratio = max(0.0, ratios[w])
    within = worst_ratio <= noise_factor
    kind: FloorVerdictKind = "within_noise" if within else "beyond_noise"
    span = ""
    if ratio_reps is not None:
        lo, hi = ratio_cis[w]
        span = f", {confidence:.0%} interval {lo:.2f}-{hi:.2f}x"
        if any(low <= noise_factor < high for low, high in ratio_cis):
            kind = "inconclusive"
    text = (
        f"A and B differ {'within' if within else 'beyond'} precision noise: worst layer {worst.layer} at "
        f"{worst_ratio:.2f}x the floor{span} (noise up to {noise_factor:g}x)"
    )
    if kind == "inconclusive":
        text += "; not settled at this sample size (an interval straddles the bound): raise --samples"
    if undecided:
        kind, text = "inconclusive", "no verdict: " + "; ".join(undecided) + f"; {text}"
    return out, text, kind


def _undecidable(ratio: float, floor_rel_l2: float) -> str | None:
    """Why a differing layer can get no verdict against its floor: a NaN ratio (NaN or infinite values in A, B or the
    floor), or a floor farther from A than rounding takes states (FLOOR_NOT_NOISE). None where it can."""
    if math.isnan(ratio) or math.isnan(floor_rel_l2):
        return "rel-L2 is NaN: A, B or the floor holds NaN or infinite values there (hsstore info shows each layer's health)"
    if floor_rel_l2 >= FLOOR_NOT_NOISE:
        return (
            f"A is rel-L2 {floor_rel_l2:.3g} from the floor, more than rounding takes states ({FLOOR_NOT_NOISE:g} or "
            "more): A or the floor is another computation or all zeros there (hsstore check names such defects)"
        )
    return None


def coarser(a_dtype: str, b_dtype: str) -> str:
    """Of two stored dtypes, the one whose rounding is larger (its unit roundoff): the pair's noise scale."""
    return max((a_dtype, b_dtype), key=lambda d: UNIT_ROUNDOFF.get(d, 0.0))


def without_floor(est: Estimate, dtype: str) -> tuple[list[LayerDiff], str]:
    """Layers with their rel-L2 in units of ``dtype``'s roundoff (the coarser of A's and B's) and the summary."""
    u = UNIT_ROUNDOFF.get(dtype)
    out = [L.replace(roundoff_ratio=L.rel_l2 / u) if u else L for L in est.layers]
    worst = max(out, key=lambda L: nan_last(L.rel_l2))
    scale = f" = {worst.roundoff_ratio:.1f}x the {dtype} unit roundoff" if u else ""
    nan = [L.layer for L in out if math.isnan(L.rel_l2)]
    return out, (
        f"no floor given (pass --floor STORE#fp32-variant for a verdict); worst rel-L2 "
        f"{worst.rel_l2:.3g} at layer {worst.layer}{scale}"
        + (f"; rel-L2 is NaN at layer(s) {', '.join(map(str, nan))}: NaN or infinite values there" if nan else "")
    )

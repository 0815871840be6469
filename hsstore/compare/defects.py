"""The audit's defect classifier: from one sample's evidence (``hsstore.compare.evidence``), the class of
each stored layer — pure rules, no I/O.

A layer can show several defects (NaN rows in a target that also leaks into an aux layer): its rows of
NaN, Inf, zeros or a constant are named first, then its other ("healthy") rows are judged by the first
rule that holds; the layer's class joins what was named with "+".
1. ``nan`` / ``inf``: rows holding NaN or Inf; ``all_zero`` / ``constant``: every row zero / constant (then
   nothing else is judged), or the rows listed.
2. ``suffix_states``: rows 0..k-1 are not this sample's (beyond noise or blank) and the rest is (a
   prefix-cache hit not written), or rows hold tokens k.. from row 0 with a blank tail (written from row 0).
3. ``bit_exact``: every value equals the live recomputation; ``within_noise``: rel-L2 of the healthy rows
   against the truth (the fp32 floor) at most ``noise_factor`` x the precision noise of that capture point.
4. ``aux_equals_target``: an aux layer within noise of the stored target layer (the target leaking
   into the conditioning layers).
5. ``capture_point``: the layer is another live capture point j (output of i-1: the input numbering;
   pre vs post final norm; shifted) — worded by ``capture_words``.
6. ``token_shift``: the rows are the truth shifted by k tokens (any k a probe row points at).
7. ``beyond_noise`` (with a floor) or ``differs`` (without one: no noise to judge against).
Across samples: ``stale_copy`` when the rows beyond noise are byte-for-byte rows of another sample (a
state slot not cleared between requests) — ``token_shift`` when they are that sample's states of this
sample's own ids shifted or offset (``hsstore.compare.stale``: the ids are wrong, the states right);
``other_weights`` when every checked sample is beyond noise in two or more layers that no rule explains
(states of another model or checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from hsstore.compare.align import MARGIN, MATCH_REL, point
from hsstore.compare.evidence import LayerEvidence
from hsstore.core.schema.diff_report import Finding, SampleVerdict

CLEAN = ("bit_exact", "within_noise")
DEFECTS = ("nan", "inf", "all_zero", "constant", "suffix_states", "token_shift", "capture_point",
           "aux_equals_target", "stale_copy", "scaled", "clipped", "wrong_dtype", "other_weights", "beyond_noise",
           "differs")
MAX_ROWS = 32  # rows listed per finding (n_rows counts them all)


def row_fields(rows: Sequence[int]) -> dict:
    return {"rows": list(rows[:MAX_ROWS]), "n_rows": len(rows)}


def span_words(rows: Sequence[int]) -> str:
    if not rows:
        return "no rows"
    if list(rows) == list(range(rows[0], rows[0] + len(rows))):
        return f"row {rows[0]}" if len(rows) == 1 else f"rows {rows[0]}..{rows[-1]}"
    shown = ", ".join(map(str, rows[:6]))
    return f"rows {shown}{', ...' if len(rows) > 6 else ''} ({len(rows)} rows)"


def _within(rel: float, noise: float | None, factor: float) -> bool:
    return noise is not None and math.isfinite(rel) and rel <= factor * noise


def _matches(rel: float, noise: float | None, others: Sequence[float], factor: float) -> bool:
    """Within noise of a point (with a floor); without one, a clear best match (as ``diff --align``)."""
    if noise is not None:
        return _within(rel, noise, factor)
    rest = sorted(x for x in others if math.isfinite(x))
    return math.isfinite(rel) and rel <= MATCH_REL and (rel == 0.0 or not rest or rest[0] >= MARGIN * rel)


def capture_words(i: int, j: int, n_layers: int) -> str:
    """What stored layer ``i`` holding live capture point ``j`` means, in words."""
    if j < 0:
        return (f"stored layer {i} holds the embeddings, the state entering layer 0 (vLLM's input id 0): "
                + ("OFF BY ONE" if i == 0 else f"shifted by {j - i:+d}"))
    if i == n_layers and j == n_layers - 1:
        return (f"stored layer {i} (labelled post-final-norm) holds the last decoder layer's output, PRE-norm: "
                "vLLM's last state is pre-norm (speculators PR #313)")
    if i == n_layers - 1 and j == n_layers:
        return (f"stored layer {i} (labelled the last layer's pre-norm output) holds the final norm's output, "
                "POST-norm (transformers' hidden_states[-1])")
    if abs(j - i) == 1:
        entering = f"; it is the state entering layer {i}, which vLLM's input numbering calls {i}" if j == i - 1 else ""
        return f"stored layer {i} holds the output of layer {j}, not of {i}: OFF BY ONE{entering}"
    return f"stored layer {i} holds the {point(j, n_layers)}: shifted by {j - i:+d}"


def judge_layer(ev: LayerEvidence, key: str, n_layers: int, is_aux: bool, target_noise: float | None,
                factor: float) -> tuple[str, list[Finding]]:
    """The class of one stored layer of one sample (its defects joined by "+"), and the findings that name
    them (none when clean): rows of NaN/Inf/zero/constant first, then what the other rows hold."""
    T, i = ev.rows, ev.label

    def found(kind: str, detail: str, **kw: object) -> Finding:
        return Finding(kind=kind, key=key, layer=i, detail=detail, **kw)

    out = []
    for kind, rows, what in (("nan", ev.nan_rows, "NaN"), ("inf", ev.inf_rows, "Inf")):
        if rows:
            whole = "every row" if len(rows) == T else span_words(rows)
            out.append(found(kind, f"layer {i}: {whole} of {T} hold{'s' if len(rows) == 1 else ''} {what}", **row_fields(rows)))
    for kind, rows, what in (("all_zero", ev.zero_rows, "zero"), ("constant", ev.const_rows, "constant")):
        if len(rows) == T:
            return kind, [found(kind, f"layer {i}: all {T} rows are {what} (a state slot never written)", **row_fields(rows))]
    if len(ev.nan_rows) + len(ev.inf_rows) == T:
        return out[0].kind, out
    rest = _healthy_rows(ev, is_aux, target_noise, factor, n_layers, found)
    if rest and rest.kind == "suffix_states":
        return rest.kind, [rest]  # its zero or constant rows are part of it
    for kind, rows, what in (("all_zero", ev.zero_rows, "all zero"), ("constant", ev.const_rows, "constant")):
        if rows:
            verb = "is" if len(rows) == 1 else "are"
            out.append(found(kind, f"layer {i}: {span_words(rows)} of {T} {verb} {what}", **row_fields(rows)))
    out += [rest] if rest else []
    if not out:
        return ("bit_exact" if ev.bit_exact == 1.0 else "within_noise"), []
    return "+".join(f.kind for f in out), out


def _healthy_rows(ev: LayerEvidence, is_aux: bool, target_noise: float | None, factor: float, n_layers: int,
                  found: Callable[..., Finding]) -> Finding | None:
    """What the layer's healthy rows (not NaN/Inf/zero/constant) hold, when it is not this sample's states of
    this layer; None when they agree (bit-exact or within noise)."""
    T, i, bad = ev.rows, ev.label, ev.bad_rows
    blank = sorted(ev.zero_rows + ev.const_rows)
    prefix = sorted(set(bad) | set(blank))
    value = _value_bug(ev, factor, found)
    if value is not None:
        return value  # before the suffix rule: a clip of the largest values may hit row 0 alone
    if prefix and len(prefix) < T and prefix == list(range(len(prefix))) and ev.noise is not None:
        return found("suffix_states", f"layer {i}: rows 0..{len(prefix) - 1} of {T} are not this sample's states, rows "
                     f"{len(prefix)}..{T - 1} are: states of a suffix only (a prefix-cache hit not written)",
                     **row_fields(prefix))
    if ev.bit_exact == 1.0 or _within(ev.rel, ev.noise, factor):
        return None
    if is_aux and ev.rel_to_target is not None and (
            ev.rel_to_target == 0.0 or _within(ev.rel_to_target, target_noise, factor)):
        return found("aux_equals_target", f"aux layer {i} equals the target layer (rel-L2 {ev.rel_to_target:.3g}): "
                     "the target leaks into the conditioning layers")
    points = {j: r for j, r in ev.rel_by_point.items() if j != i}
    hits = [j for j, r in points.items()
            if _matches(r, ev.noise_by_point.get(j), [x for k, x in ev.rel_by_point.items() if k != j], factor)]
    if hits:
        j = min(hits, key=lambda j: points[j] / max(ev.noise_by_point.get(j) or 1.0, 1e-30))
        if is_aux and j == n_layers:
            return found("aux_equals_target", f"aux layer {i} holds the final norm's output (rel-L2 {points[j]:.3g}): "
                         "the last layer's state leaks into the conditioning layers through the final norm", match=j)
        return found("capture_point", f"{capture_words(i, j, n_layers)} (rel-L2 {points[j]:.3g})", match=j)
    shifts = [k for k, r in ev.rel_shifted.items()
              if _matches(r, ev.noise, [x for q, x in ev.rel_shifted.items() if q != k] + [ev.rel], factor)]
    if shifts:
        k = min(shifts, key=lambda k: ev.rel_shifted[k])
        if k < 0 and blank == list(range(T + k, T)):
            return found("suffix_states", f"layer {i}: rows 0..{T + k - 1} of {T} hold the states of tokens {-k}..{T - 1} "
                         f"(a suffix written from row 0: a prefix-cache hit of {-k} tokens), rows {T + k}..{T - 1} "
                         "are blank", match=k, **row_fields(list(range(T))))
        way = f"row t holds the state of token t{'-' if k > 0 else '+'}{abs(k)}"
        return found("token_shift", f"layer {i}: tokens and states are misaligned by {k:+d} ({way}; rel-L2 "
                     f"{ev.rel_shifted[k]:.3g} shifted vs {ev.rel:.3g} as stored)", match=k)
    if ev.noise is None:
        return found("differs", f"layer {i}: rel-L2 {ev.rel:.3g} against the live states, no floor to judge it "
                     "(pass --floor live)", **row_fields(bad))
    ratio = ev.rel / ev.noise if ev.noise else math.inf
    where = f"in {span_words(bad)}" if bad else "spread over the rows (no row alone beyond noise)"
    if ev.noise_like:
        where += "; the difference does not repeat at rows of one token: noise added to the states"
    return found("beyond_noise", f"layer {i}: rel-L2 {ev.rel:.3g} = {ratio:.3g} x the precision noise "
                 f"({ev.noise:.3g}), {where}", **row_fields(bad))


def _value_bug(ev: LayerEvidence, factor: float, found: Callable[..., Finding]) -> Finding | None:
    """A whole-layer value bug (``hsstore.compare.transforms``) that, undone, leaves the layer within noise."""
    fits = {k: r for k, (r, _) in ev.transforms.items() if _within(r, ev.noise, factor)}
    if not fits:
        return None
    kind = min(fits, key=fits.__getitem__)
    rel, words = ev.transforms[kind]
    return found(kind, f"layer {ev.label}: {words} (rel-L2 {ev.rel:.3g} as stored, {rel:.3g} with that undone: "
                 "within precision noise)", **row_fields(ev.bad_rows))


def judge_sample(key: str, evidence: list[LayerEvidence], aux: Sequence[int], target: int | None, n_layers: int,
                 factor: float) -> tuple[SampleVerdict, list[Finding]]:
    """Every stored layer's class for one sample, its verdict and findings."""
    tnoise = next((e.noise for e in evidence if e.label == target), None)
    kinds: dict[str, str] = {}
    findings: list[Finding] = []
    ratios: dict[str, float] = {}
    for ev in evidence:
        kind, found = judge_layer(ev, key, n_layers, ev.label in aux, tnoise, factor)
        kinds[str(ev.label)] = kind
        if ev.noise and math.isfinite(ev.rel):
            ratios[str(ev.label)] = ev.rel / ev.noise
        findings += found
    T = evidence[0].rows if evidence else 0
    return SampleVerdict(key=key, tokens=T, verdict=verdict_of(kinds), layers=kinds, floor_ratio=ratios), findings


def verdict_of(kinds: dict[str, str]) -> str:
    named = {k for cell in kinds.values() for k in cell.split("+")}
    found = [k for k in DEFECTS if k in named]
    if found:
        return "+".join(found)
    return "bit_exact" if all(k == "bit_exact" for k in kinds.values()) else "within_noise"


def other_weights(verdicts: list[SampleVerdict], findings: list[Finding],
                  noise_like: frozenset[tuple[str, int]] = frozenset()) -> list[Finding]:
    """When every checked sample (two or more) is beyond noise in two or more layers no rule explains, the
    states are of other weights: those findings are rewritten as ``other_weights``. Layers whose difference
    is noise added to the states (``noise_like``: (key, layer)) are no evidence of other weights."""
    unexplained = {v.key: [L for L, k in v.layers.items() if {"beyond_noise", "differs"} & set(k.split("+"))
                           and (v.key, int(L)) not in noise_like] for v in verdicts}
    if len(verdicts) < 2 or not all(len(ls) >= 2 for ls in unexplained.values()):
        return findings
    out = []
    for f in findings:
        if f.kind in ("beyond_noise", "differs") and (f.key, f.layer) not in noise_like:
            f = Finding(kind="other_weights", key=f.key, layer=f.layer,
                        detail=f"{f.detail}; every checked sample diverges so in 2+ layers: states of other "
                               "weights (another checkpoint or config) than the model given")
        out.append(f)
    return out


def apply(verdicts: list[SampleVerdict], findings: list[Finding]) -> list[SampleVerdict]:
    """The sample verdicts with each layer's class taken from the (rewritten) findings."""
    by: dict[tuple[str, int | None], list[str]] = {}
    for f in findings:
        by.setdefault((f.key, f.layer), []).append(f.kind)
    out = []
    for v in verdicts:
        kinds = {L: "+".join(by[(v.key, int(L))]) if (v.key, int(L)) in by else k for L, k in v.layers.items()}
        out.append(v.replace(layers=kinds, verdict=verdict_of(kinds)))
    return out


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
    return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
               for i in range(k + 1))

"""The audit's defect classifier: from one sample's evidence (``hsstore.compare.defects``), the class of
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
   pre vs post final norm; shifted) — worded by ``hsstore.compare.align.capture_words``.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypedDict, get_args

import torch
import xxhash

from hsstore.compare.align import MARGIN, MATCH_REL, capture_words
from hsstore.compare.kernel import coherent_difference, rel_l2, row_rel
from hsstore.core.schema.record import UNSET, UnsetType
from hsstore.core.schema.reports import DefectKind, Finding, SampleVerdict

# --- What one sample's stored states say against a live recomputation: the numbers the defect classifier

SHIFTS = (1, 2, 3, -1, -2, -3)  # token shifts always tried: row t holds the truth of row t - k
PROBES = 8  # rows whose nearest truth row proposes a further shift
ROW_SLACK = 4.0  # a row is "beyond noise" above this multiple of max(its own noise, the layer's)


# the whole-layer value bugs transform_fits undoes (defect kinds)
ValueBug = Literal["scaled", "clipped", "wrong_dtype"]


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
    transforms: dict[ValueBug, tuple[float, str]] = field(
        default_factory=dict
    )  # beyond noise: rel-L2 with a value bug undone
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
    rows: list[list[int]] = [torch.nonzero(m).flatten().tolist() for m in (nan, inf, zero, const)]
    return rows[0], rows[1], rows[2], rows[3]


def sample_evidence(
    stored: dict[int, torch.Tensor],
    live: dict[int, torch.Tensor],
    floor: dict[int, torch.Tensor] | None,
    target: int | None,
    noise_factor: float,
    tokens: torch.Tensor | None = None,
) -> list[LayerEvidence]:
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
        ev = LayerEvidence(
            label, int(s.shape[0]), nan_rows, inf_rows, zero_rows, const_rows, math.nan, math.nan, noise.get(label)
        )
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
            ev.bad_rows = _bad_rows(s, live[label], floor.get(label), healthy, ev.noise, noise_factor)
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


def _bad_rows(
    s: torch.Tensor,
    live: torch.Tensor,
    floor: torch.Tensor | None,
    finite: torch.Tensor,
    noise: float | None,
    noise_factor: float,
) -> list[int]:
    """Finite rows beyond noise: above ROW_SLACK x noise_factor x max(the row's own noise, the layer's)."""
    if floor is None:
        differs = (s != live.to(s.dtype)).any(1)
        return torch.nonzero(differs & finite).flatten().tolist()
    r = row_rel(s, floor)
    own = row_rel(live, floor)
    bound = ROW_SLACK * noise_factor * torch.clamp(own, min=noise or 0.0)
    return torch.nonzero((r > bound) & finite).flatten().tolist()


CLEAN = ("bit_exact", "within_noise")
DEFECTS: tuple[DefectKind, ...] = get_args(DefectKind)  # in the order a verdict line counts them
MAX_ROWS = 32  # rows listed per finding (n_rows counts them all)


class RowFields(TypedDict):
    """A finding's rows: the first MAX_ROWS and how many."""

    rows: list[int]
    n_rows: int


class Found(Protocol):
    """judge_layer's ``found``: a Finding of this sample's layer."""

    def __call__(
        self,
        kind: DefectKind,
        detail: str,
        *,
        rows: list[int] | UnsetType = UNSET,
        n_rows: int | UnsetType = UNSET,
        match: int | UnsetType = UNSET,
    ) -> Finding: ...


def row_fields(rows: Sequence[int]) -> RowFields:
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


def judge_layer(
    ev: LayerEvidence, key: str, n_layers: int, is_aux: bool, target_noise: float | None, factor: float
) -> tuple[str, list[Finding]]:
    """The class of one stored layer of one sample (its defects joined by "+"), and the findings that name
    them (none when clean): rows of NaN/Inf/zero/constant first, then what the other rows hold."""
    found = _finder(key, ev.label)
    blank = _blank_layer(ev, found)
    if blank is not None:
        return blank.kind, [blank]
    out = _unhealthy_rows(ev, found)
    if len(ev.nan_rows) + len(ev.inf_rows) == ev.rows:
        return out[0].kind, out
    rest = _healthy_rows(ev, is_aux, target_noise, factor, n_layers, found)
    if rest and rest.kind == "suffix_states":
        return rest.kind, [rest]  # its zero or constant rows are part of it
    out += _blank_rows(ev, found)
    out += [rest] if rest else []
    if not out:
        return ("bit_exact" if ev.bit_exact == 1.0 else "within_noise"), []
    return "+".join(f.kind for f in out), out


def _finder(key: str, layer: int) -> Found:
    """judge_layer's ``found``: a Finding of sample ``key``'s stored layer ``layer``."""

    def found(
        kind: DefectKind,
        detail: str,
        *,
        rows: list[int] | UnsetType = UNSET,
        n_rows: int | UnsetType = UNSET,
        match: int | UnsetType = UNSET,
    ) -> Finding:
        return Finding(kind=kind, key=key, layer=layer, detail=detail, rows=rows, n_rows=n_rows, match=match)

    return found


def _blank_layer(ev: LayerEvidence, found: Found) -> Finding | None:
    """The finding of a layer whose every row is zero (or every row constant): a state slot never written, the
    layer's only class; None otherwise."""
    T, i = ev.rows, ev.label
    blank: tuple[tuple[DefectKind, list[int], str], ...] = (
        ("all_zero", ev.zero_rows, "zero"),
        ("constant", ev.const_rows, "constant"),
    )
    for kind, rows, what in blank:
        if len(rows) == T:
            return found(kind, f"layer {i}: all {T} rows are {what} (a state slot never written)", **row_fields(rows))
    return None


def _unhealthy_rows(ev: LayerEvidence, found: Found) -> list[Finding]:
    """The findings of the layer's rows that hold NaN, then of those that hold Inf (none when it has no such row)."""
    T, i = ev.rows, ev.label
    out: list[Finding] = []
    unhealthy: tuple[tuple[DefectKind, list[int], str], ...] = (
        ("nan", ev.nan_rows, "NaN"),
        ("inf", ev.inf_rows, "Inf"),
    )
    for kind, rows, what in unhealthy:
        if rows:
            whole = "every row" if len(rows) == T else span_words(rows)
            out.append(
                found(kind, f"layer {i}: {whole} of {T} hold{'s' if len(rows) == 1 else ''} {what}", **row_fields(rows))
            )
    return out


def _blank_rows(ev: LayerEvidence, found: Found) -> list[Finding]:
    """The findings of the layer's rows that are all zero, then of those that are constant, in a layer that has
    other rows too (none when it has no such row)."""
    T, i = ev.rows, ev.label
    out: list[Finding] = []
    partly_blank: tuple[tuple[DefectKind, list[int], str], ...] = (
        ("all_zero", ev.zero_rows, "all zero"),
        ("constant", ev.const_rows, "constant"),
    )
    for kind, rows, what in partly_blank:
        if rows:
            verb = "is" if len(rows) == 1 else "are"
            out.append(found(kind, f"layer {i}: {span_words(rows)} of {T} {verb} {what}", **row_fields(rows)))
    return out


def _healthy_rows(
    ev: LayerEvidence, is_aux: bool, target_noise: float | None, factor: float, n_layers: int, found: Found
) -> Finding | None:
    """What the layer's healthy rows (not NaN/Inf/zero/constant) hold, when it is not this sample's states of
    this layer; None when they agree (bit-exact or within noise). The first rule that holds names it: a
    value bug, a suffix, the target in an aux layer, another capture point, shifted tokens; else the
    divergence is unexplained."""
    value = _value_bug(ev, factor, found)
    if value is not None:
        return value  # before the suffix rule: a clip of the largest values may hit row 0 alone
    suffix = _unwritten_prefix(ev, found)
    if suffix is not None:
        return suffix
    if ev.bit_exact == 1.0 or _within(ev.rel, ev.noise, factor):
        return None
    return (
        _target_leak(ev, is_aux, target_noise, factor, found)
        or _other_point(ev, is_aux, factor, n_layers, found)
        or _shifted(ev, factor, found)
        or _unexplained(ev, found)
    )


def _unwritten_prefix(ev: LayerEvidence, found: Found) -> Finding | None:
    """``suffix_states`` when the rows beyond noise or blank are exactly rows 0..k-1 (and not all rows): a
    prefix-cache hit whose prefix was not written; None otherwise (and without a floor)."""
    T, i = ev.rows, ev.label
    prefix = sorted(set(ev.bad_rows) | set(ev.zero_rows + ev.const_rows))
    if prefix and len(prefix) < T and prefix == list(range(len(prefix))) and ev.noise is not None:
        return found(
            "suffix_states",
            f"layer {i}: rows 0..{len(prefix) - 1} of {T} are not this sample's states, rows "
            f"{len(prefix)}..{T - 1} are: states of a suffix only (a prefix-cache hit not written)",
            **row_fields(prefix),
        )
    return None


def _target_leak(
    ev: LayerEvidence, is_aux: bool, target_noise: float | None, factor: float, found: Found
) -> Finding | None:
    """``aux_equals_target`` when an aux layer equals the stored target layer (bit for bit, or within the
    target's noise); None otherwise."""
    if (
        is_aux
        and ev.rel_to_target is not None
        and (ev.rel_to_target == 0.0 or _within(ev.rel_to_target, target_noise, factor))
    ):
        return found(
            "aux_equals_target",
            f"aux layer {ev.label} equals the target layer (rel-L2 {ev.rel_to_target:.3g}): "
            "the target leaks into the conditioning layers",
        )
    return None


def _other_point(ev: LayerEvidence, is_aux: bool, factor: float, n_layers: int, found: Found) -> Finding | None:
    """``capture_point`` when the layer matches another live capture point (the closest, relative to its noise),
    or ``aux_equals_target`` when that point is the final norm's output in an aux layer; None when none matches."""
    i = ev.label
    points = {j: r for j, r in ev.rel_by_point.items() if j != i}
    hits = [
        j
        for j, r in points.items()
        if _matches(r, ev.noise_by_point.get(j), [x for k, x in ev.rel_by_point.items() if k != j], factor)
    ]
    if not hits:
        return None
    j = min(hits, key=lambda j: points[j] / max(ev.noise_by_point.get(j) or 1.0, 1e-30))
    if is_aux and j == n_layers:
        return found(
            "aux_equals_target",
            f"aux layer {i} holds the final norm's output (rel-L2 {points[j]:.3g}): "
            "the last layer's state leaks into the conditioning layers through the final norm",
            match=j,
        )
    return found("capture_point", f"{capture_words(i, j, n_layers)} (rel-L2 {points[j]:.3g})", match=j)


def _shifted(ev: LayerEvidence, factor: float, found: Found) -> Finding | None:
    """``token_shift`` when the rows match the truth shifted by k tokens (the best such k), or ``suffix_states``
    when k < 0 and the last -k rows are blank (a suffix written from row 0); None when no shift matches."""
    T, i = ev.rows, ev.label
    shifts = [
        k
        for k, r in ev.rel_shifted.items()
        if _matches(r, ev.noise, [x for q, x in ev.rel_shifted.items() if q != k] + [ev.rel], factor)
    ]
    if not shifts:
        return None
    k = min(shifts, key=lambda k: ev.rel_shifted[k])
    if k < 0 and sorted(ev.zero_rows + ev.const_rows) == list(range(T + k, T)):
        return found(
            "suffix_states",
            f"layer {i}: rows 0..{T + k - 1} of {T} hold the states of tokens {-k}..{T - 1} "
            f"(a suffix written from row 0: a prefix-cache hit of {-k} tokens), rows {T + k}..{T - 1} "
            "are blank",
            match=k,
            **row_fields(list(range(T))),
        )
    way = f"row t holds the state of token t{'-' if k > 0 else '+'}{abs(k)}"
    return found(
        "token_shift",
        f"layer {i}: tokens and states are misaligned by {k:+d} ({way}; rel-L2 "
        f"{ev.rel_shifted[k]:.3g} shifted vs {ev.rel:.3g} as stored)",
        match=k,
    )


def _unexplained(ev: LayerEvidence, found: Found) -> Finding:
    """A divergence no rule explains: ``differs`` without a floor (no noise to judge it against), else
    ``beyond_noise`` with its ratio to the precision noise and the rows beyond it."""
    i, bad = ev.label, ev.bad_rows
    if ev.noise is None:
        return found(
            "differs",
            f"layer {i}: rel-L2 {ev.rel:.3g} against the live states, no floor to judge it (pass --floor live)",
            **row_fields(bad),
        )
    ratio = ev.rel / ev.noise if ev.noise else math.inf
    where = f"in {span_words(bad)}" if bad else "spread over the rows (no row alone beyond noise)"
    if ev.noise_like:
        where += "; the difference does not repeat at rows of one token: noise added to the states"
    return found(
        "beyond_noise",
        f"layer {i}: rel-L2 {ev.rel:.3g} = {ratio:.3g} x the precision noise ({ev.noise:.3g}), {where}",
        **row_fields(bad),
    )


def _value_bug(ev: LayerEvidence, factor: float, found: Found) -> Finding | None:
    """A whole-layer value bug (``hsstore.compare.defects``) that, undone, leaves the layer within noise."""
    fits = {k: r for k, (r, _) in ev.transforms.items() if _within(r, ev.noise, factor)}
    if not fits:
        return None
    kind = min(fits, key=fits.__getitem__)
    rel, words = ev.transforms[kind]
    return found(
        kind,
        f"layer {ev.label}: {words} (rel-L2 {ev.rel:.3g} as stored, {rel:.3g} with that undone: "
        "within precision noise)",
        **row_fields(ev.bad_rows),
    )


def judge_sample(
    key: str, evidence: list[LayerEvidence], aux: Sequence[int], target: int | None, n_layers: int, factor: float
) -> tuple[SampleVerdict, list[Finding]]:
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


def other_weights(
    verdicts: list[SampleVerdict], findings: list[Finding], noise_like: frozenset[tuple[str, int]] = frozenset()
) -> list[Finding]:
    """When every checked sample (two or more) is beyond noise in two or more layers no rule explains, the
    states are of other weights: those findings are rewritten as ``other_weights``. Layers whose difference
    is noise added to the states (``noise_like``: (key, layer)) are no evidence of other weights."""
    unexplained = {
        v.key: [
            L
            for L, k in v.layers.items()
            if {"beyond_noise", "differs"} & set(k.split("+")) and (v.key, int(L)) not in noise_like
        ]
        for v in verdicts
    }
    if len(verdicts) < 2 or not all(len(ls) >= 2 for ls in unexplained.values()):
        return findings
    out = []
    for f in findings:
        if f.kind in ("beyond_noise", "differs") and (f.key, f.layer) not in noise_like:
            f = Finding(
                kind="other_weights",
                key=f.key,
                layer=f.layer,
                detail=f"{f.detail}; every checked sample diverges so in 2+ layers: states of other "
                "weights (another checkpoint or config) than the model given",
            )
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


# --- Whole-layer value bugs of a writer: correct states with one transform applied to every value — scaled by a

CLIP_SLACK = 2.0**-7  # the truth must exceed the stored maximum by more than bf16's rounding to call it clipped
OTHER_16BIT = {torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}
NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def transform_fits(
    s: torch.Tensor, truth: torch.Tensor, healthy: torch.Tensor, noise: float | None, noise_factor: float
) -> dict[ValueBug, tuple[float, str]]:
    """For each transform that could explain stored ``s`` ``[T, H]`` against ``truth``: (rel-L2 of the
    healthy rows once it is undone, the transform in words). A fitted scale alpha is a candidate only when
    it is itself a difference beyond the precision noise (``|alpha - 1| > noise_factor x noise``: rel-L2 of
    alpha x truth against the truth): the measured noise of the cache's dtype sets how small a scale is
    seen (x 1.001 in an fp32 cache, whose noise is ~1e-7; not in a bf16 one, whose rounding is ~3e-3)."""
    out: dict[ValueBug, tuple[float, str]] = {}
    sf, tf = s[healthy].double(), truth[healthy].double()
    if sf.numel() == 0:
        return out
    den = float(tf.square().sum())
    if den > 0:
        alpha = float((sf * tf).sum()) / den
        if alpha > 0 and noise is not None and abs(alpha - 1.0) > noise_factor * noise:
            out["scaled"] = (rel_l2(sf, alpha * tf), f"every value is the truth x {_scale_words(alpha)}")
    c = float(sf.abs().max())
    if c > 0 and float(tf.abs().max()) > c * (1.0 + CLIP_SLACK):
        hit = int((tf.abs() > c * (1.0 + CLIP_SLACK)).any(1).sum())
        out["clipped"] = (
            rel_l2(sf, tf.clamp(-c, c)),
            f"values clipped at +-{c:.6g} (the truth reaches {float(tf.abs().max()):.6g}, in {hit} row(s))",
        )
    other = OTHER_16BIT.get(s.dtype)
    if other is not None:
        v = s.view(other).double()
        ok = torch.isfinite(v).all(1)
        if bool(ok.any()):
            out["wrong_dtype"] = (
                rel_l2(v[ok], truth[ok].double()),
                f"the bytes are {NAMES[other]} values read as {NAMES[s.dtype]}",
            )
    if s.dtype == torch.float32 and (narrow := narrower_values(sf)) is not None:  # (a scan of the layer)
        out["wrong_dtype"] = (
            0.0,
            f"every value is a {narrow} value stored as fp32: the states were computed (or "
            f"rounded) at {narrow}, not at fp32; audit again with --dtype {narrow} to judge "
            "them at that precision",
        )
    return {k: (r, w) for k, (r, w) in out.items() if math.isfinite(r)}


def _scale_words(alpha: float) -> str:
    """The fitted scale with enough digits to show how far it is from 1 (1.001, 0.9999)."""
    digits = max(4, 2 - math.floor(math.log10(abs(alpha - 1.0)))) if alpha != 1.0 else 4
    return f"{alpha:.{digits}g}"


def narrower_values(x: torch.Tensor) -> str | None:
    """'bf16' or 'fp16' when every (finite, healthy) fp32 value of ``x`` is exactly a value of that type."""
    x = x.float()
    if x.numel() < 2 or not bool(torch.isfinite(x).all()) or not bool(x.any()):
        return None
    if bool((x.view(torch.int32) & 0xFFFF).eq(0).all()):
        return "bf16"
    if bool(x.abs().max() <= 65504.0) and bool(x.half().float().eq(x).all()):
        return "fp16"
    return None

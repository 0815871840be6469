"""Human-readable text of the ``diff``, ``check`` and ``diff --align`` reports, rendered from their records
(``--json`` is the record itself)."""

from __future__ import annotations

from typing import Any

from hsstore.core.schema.diff_report import AlignReport, CheckReport, DiffReport, FieldDifference, LayerDiff
from hsstore.core.schema.record import is_set, or_none


def _value(v: Any) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."


def provenance_lines(diffs: list[FieldDifference]) -> list[str]:
    """The provenance fields in which A, B (and C) differ, numeric ones first."""
    if not diffs:
        return ["provenance: A and B agree on every recorded field"]
    floor = any(is_set(d.c) for d in diffs)
    lines = ["provenance differences (A | B" + (" | C" if floor else "") + "):"]
    for d in sorted(diffs, key=lambda d: (d.informational, d.field)):
        cols = [_value(d.a), _value(d.b)] + ([_value(d.c if is_set(d.c) else "-")] if floor else [])
        lines.append(f"  {d.field}: " + " | ".join(cols) + ("  (informational)" if d.informational else ""))
    return lines


def _ci(L: LayerDiff, name: str, fmt: str) -> str:
    lo, hi = (or_none(L.ci) or {}).get(name, (None, None))
    return "" if lo is None else f" [{lo:{fmt}}, {hi:{fmt}}]"


def _floor_cell(L: LayerDiff) -> str:
    ratio = or_none(L.floor_ratio)
    return f"  {ratio:7.2f}" if ratio is not None else "        -"


def diff_text(r: DiffReport) -> str:
    lines = [f"A: {r.a_target or r.a}  ({r.a})", f"B: {r.b_target or r.b}  ({r.b})"]
    if r.floor:
        lines.append(f"C (floor): {r.floor_target or r.floor}  ({r.floor})")
    lines += provenance_lines(r.provenance_differences)
    s = r.sampling
    if s:
        lines.append(f"SAMPLED: {s.samples:,} of {s.population:,} shared samples ({s.fraction:.2%}, seed "
                     f"{s.seed}, {s.strata} length strata); [lo, hi] = {s.confidence:.0%} intervals")
    lines.append(f"shared samples {r.shared_samples:,} ({r.tokens:,} tokens compared), only in A "
                 f"{r.only_a:,}, only in B {r.only_b:,}")
    head = " layer   mean_abs    max_abs    rel_l2  cos_mean   cos_min   cos_p01  bit_exact"
    lines.append(head + ("  floor_x" if r.floor else ""))
    for L in r.layers:
        lines.append(f"{L.layer:6d} {L.mean_abs:10.3e} {L.max_abs:10.3e} {L.rel_l2:9.3e} {L.cos_mean:9.6f} "
                     f"{L.cos_min:9.6f} {L.cos_p01:9.6f} {L.bit_exact:10.4f}" + (_floor_cell(L) if r.floor else ""))
        if L.ci:
            lines.append(f"        rel_l2{_ci(L, 'rel_l2', '.3e')}" + (f"  floor_x{_ci(L, 'floor_ratio', '.2f')}"
                                                                      if "floor_ratio" in L.ci else ""))
        if L.verdict:
            lines.append(f"        {L.verdict}")
    if r.worst_samples:
        lines.append("worst samples (rel-L2 at the deepest layer): " +
                     ", ".join(f"{w.key[:12]}… {w.rel_l2:.2e}" for w in r.worst_samples[:5]))
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"verdict: {r.verdict}")
    return "\n".join(lines)


def check_text(r: CheckReport) -> str:
    lines = [f"model: {r.model}  (fingerprint {r.model_fingerprint[:16]}"
             + (", as recorded)" if r.same_model else f", recorded {r.recorded_model_fingerprint[:16]}: OTHER WEIGHTS)"),
             f"variant: {r.target}  ({r.variant}), {r.dtype} on {r.device}",
             f"recomputed {r.samples} samples ({r.tokens:,} tokens) in their {r.batches} recorded batch(es): "
             f"{r.batching}"]
    for d in r.environment_differences:
        lines.append(f"  differs from the record: {d.field}: {_value(d.a)} here, {_value(d.b)} recorded")
    lines.append(" layer    rel_l2   bit_exact   max_abs   cos_min" + ("  floor_x" if r.floor else ""))
    for L in r.layers:
        lines.append(f"{L.layer:6d} {L.rel_l2:9.3e} {L.bit_exact:10.6f} {L.max_abs:9.3e} {L.cos_min:9.6f}"
                     + (_floor_cell(L) if r.floor else ""))
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"verdict: {r.verdict}")
    return "\n".join(lines)


def audit_text(r: CheckReport) -> str:
    """The audit: one verdict line, how it recomputed (and what it assumed), the bound, a table of samples
    by stored layer, then each finding."""
    rc = or_none(r.recompute) or {}
    lines = [f"verdict: {r.verdict}",
             f"variant: {r.target}  ({r.variant}); model {r.model} (fingerprint {r.model_fingerprint[:16]}"
             + (", as recorded)" if r.same_model else f", recorded {r.recorded_model_fingerprint[:16]})"),
             f"recomputed {r.samples} of {or_none(r.population)} samples ({r.tokens:,} tokens) with backend "
             f"{rc.get('backend')}, {rc.get('dtype')}, {rc.get('attention')} attention on {rc.get('device')}, "
             f"{r.batching}; floor: {r.floor if is_set(r.floor) else 'none'}"]
    lines += [f"  assumed {k}: {v}" for k, v in r.assumed.items()]
    lines.append(f"bound: {or_none(r.bound)}")
    labels = list(r.sample_verdicts[0].layers) if r.sample_verdicts else []
    lines.append(f"{'sample':18} {'tokens':>6}  " + "  ".join(f"{'layer ' + L:>14}" for L in labels) + "  verdict")
    for v in r.sample_verdicts:
        cells = "  ".join(f"{v.layers[L]:>14}" for L in labels)
        lines.append(f"{v.key[:16]:18} {v.tokens:6d}  {cells}  {v.verdict}")
    lines += [f"- {f.key[:16]}: {f.kind}: {f.detail}" for f in r.findings[:50]]
    if len(r.findings) > 50:
        lines.append(f"  ... {len(r.findings) - 50} more findings in --json")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def align_text(r: AlignReport) -> str:
    lines = [f"A: {r.a_target}  ({r.a}), capture {r.a_capture}", f"B: {r.b_target}  ({r.b})",
             f"matched each of A's layers against B's on {r.samples} shared samples ({r.tokens:,} tokens):"]
    lines += [f"  B's layer {j}: {p}" for j, p in r.b_points.items()]
    head = "  A layer  " + " ".join(f"B{j:>9}" for j in r.b_layers) + "   best"
    lines.append("rel-L2 of A's layer against each of B's:")
    lines.append(head)
    for L in r.layers:
        cells = " ".join(f"{L.rel_l2_by_b_layer[str(j)]:10.3e}" for j in r.b_layers)
        lines.append(f"  {L.layer:7d}  {cells}   B{L.match}")
    lines += [f"- {L.message}" for L in r.layers]
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"verdict: {r.summary}")
    return "\n".join(lines)

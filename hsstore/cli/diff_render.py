"""Human-readable text of a ``diff`` report (the JSON is the data; this is only its rendering)."""

from __future__ import annotations

from typing import Any


def _value(v: Any) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."


def provenance_lines(r: dict[str, Any]) -> list[str]:
    """The provenance fields in which A, B (and C) differ, numeric ones first."""
    diffs = r.get("provenance_differences") or []
    if not diffs:
        return ["provenance: A and B agree on every recorded field"]
    floor = any("c" in d for d in diffs)
    lines = ["provenance differences (A | B" + (" | C" if floor else "") + "):"]
    for d in sorted(diffs, key=lambda d: (d.get("informational", False), d["field"])):
        cols = [_value(d.get("a")), _value(d.get("b"))] + ([_value(d.get("c", "-"))] if floor else [])
        note = "  (informational)" if d.get("informational") else ""
        lines.append(f"  {d['field']}: " + " | ".join(cols) + note)
    return lines


def _ci(L: dict[str, Any], name: str, fmt: str) -> str:
    lo, hi = L.get("ci", {}).get(name, (None, None))
    return "" if lo is None else f" [{lo:{fmt}}, {hi:{fmt}}]"


def diff_text(r: dict[str, Any]) -> str:
    lines = [f"A: {r.get('a_target') or r['a']}  ({r['a']})", f"B: {r.get('b_target') or r['b']}  ({r['b']})"]
    if r.get("floor"):
        lines.append(f"C (floor): {r.get('floor_target') or r['floor']}  ({r['floor']})")
    lines += provenance_lines(r)
    s = r.get("sampling")
    if s:
        lines.append(f"SAMPLED: {s['samples']:,} of {s['population']:,} shared samples ({s['fraction']:.2%}, seed "
                     f"{s['seed']}, {s['strata']} length strata); [lo, hi] = {s['confidence']:.0%} intervals")
    lines.append(f"shared samples {r['shared_samples']:,} ({r['tokens']:,} tokens compared), only in A "
                 f"{r['only_a']:,}, only in B {r['only_b']:,}")
    head = " layer   mean_abs    max_abs    rel_l2  cos_mean   cos_min   cos_p01  bit_exact"
    head += "  floor_x" if r.get("floor") else ""
    lines.append(head)
    for L in r["layers"]:
        row = (f"{L['layer']:6d} {L['mean_abs']:10.3e} {L['max_abs']:10.3e} {L['rel_l2']:9.3e} {L['cos_mean']:9.6f} "
               f"{L['cos_min']:9.6f} {L['cos_p01']:9.6f} {L['bit_exact']:10.4f}")
        if r.get("floor"):
            row += f"  {L['floor_ratio']:7.2f}" if L.get("floor_ratio") is not None else "        -"
        lines.append(row)
        if L.get("ci"):
            lines.append(f"        rel_l2{_ci(L, 'rel_l2', '.3e')}" + (f"  floor_x{_ci(L, 'floor_ratio', '.2f')}"
                                                                      if "floor_ratio" in L["ci"] else ""))
        if L.get("verdict"):
            lines.append(f"        {L['verdict']}")
    if r.get("worst_samples"):
        lines.append("worst samples (rel-L2 at the deepest layer): " +
                     ", ".join(f"{w['key'][:12]}… {w['rel_l2']:.2e}" for w in r["worst_samples"][:5]))
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)


def check_text(r: dict[str, Any]) -> str:
    lines = [f"model: {r['model']}  (fingerprint {r['model_fingerprint'][:16]}"
             + (", as recorded)" if r["same_model"] else f", recorded {r['recorded_model_fingerprint'][:16]}: OTHER WEIGHTS)"),
             f"variant: {r['target']}  ({r['variant']}), {r['dtype']} on {r['device']}",
             f"recomputed {r['samples']} samples ({r['tokens']:,} tokens) in their {r['batches']} recorded batch(es): "
             f"{r['batching']}"]
    for d in r.get("environment_differences", []):
        lines.append(f"  differs from the record: {d['field']}: {_value(d['a'])} here, {_value(d['b'])} recorded")
    lines.append(" layer    rel_l2   bit_exact   max_abs   cos_min" + ("  floor_x" if r.get("floor") else ""))
    for L in r["layers"]:
        row = f"{L['layer']:6d} {L['rel_l2']:9.3e} {L['bit_exact']:10.6f} {L['max_abs']:9.3e} {L['cos_min']:9.6f}"
        if r.get("floor"):
            row += f"  {L['floor_ratio']:7.2f}" if L.get("floor_ratio") is not None else "        -"
        lines.append(row)
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)


def audit_text(r: dict[str, Any]) -> str:
    """The audit: one verdict line, how it recomputed (and what it assumed), the bound, a table of samples
    by stored layer, then each finding."""
    rc = r["recompute"]
    lines = [f"verdict: {r['verdict']}",
             f"variant: {r['target']}  ({r['variant']}); model {r['model']} (fingerprint {r['model_fingerprint'][:16]}"
             + (", as recorded)" if r["same_model"] else f", recorded {r['recorded_model_fingerprint'][:16]})"),
             f"recomputed {r['samples']} of {r['population']} samples ({r['tokens']:,} tokens) with backend "
             f"{rc['backend']}, {rc['dtype']}, {rc['attention']} attention on {rc['device']}, {r['batching']}; floor: "
             f"{r.get('floor', 'none')}"]
    lines += [f"  assumed {k}: {v}" for k, v in r.get("assumed", {}).items()]
    lines.append(f"bound: {r['bound']}")
    labels = list(r["sample_verdicts"][0]["layers"]) if r["sample_verdicts"] else []
    lines.append(f"{'sample':18} {'tokens':>6}  " + "  ".join(f"{'layer ' + L:>14}" for L in labels) + "  verdict")
    for v in r["sample_verdicts"]:
        cells = "  ".join(f"{v['layers'][L]:>14}" for L in labels)
        lines.append(f"{v['key'][:16]:18} {v['tokens']:6d}  {cells}  {v['verdict']}")
    lines += [f"- {f['key'][:16]}: {f['kind']}: {f['detail']}" for f in r.get("findings", [])[:50]]
    if len(r.get("findings", [])) > 50:
        lines.append(f"  ... {len(r['findings']) - 50} more findings in --json")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    return "\n".join(lines)


def align_text(r: dict[str, Any]) -> str:
    lines = [f"A: {r['a_target']}  ({r['a']}), capture {r['a_capture']}", f"B: {r['b_target']}  ({r['b']})",
             f"matched each of A's layers against B's on {r['samples']} shared samples ({r['tokens']:,} tokens):"]
    lines += [f"  B's layer {j}: {p}" for j, p in r["b_points"].items()]
    head = "  A layer  " + " ".join(f"B{j:>9}" for j in r["b_layers"]) + "   best"
    lines.append("rel-L2 of A's layer against each of B's:")
    lines.append(head)
    for L in r["layers"]:
        cells = " ".join(f"{L['rel_l2_by_b_layer'][str(j)]:10.3e}" for j in r["b_layers"])
        lines.append(f"  {L['layer']:7d}  {cells}   B{L['match']}")
    lines += [f"- {L['message']}" for L in r["layers"]]
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines.append(f"verdict: {r['summary']}")
    return "\n".join(lines)

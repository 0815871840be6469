"""Human-readable text for ``info`` and ``diff`` (the JSON is the data; this is only its rendering)."""

from __future__ import annotations

from typing import Any


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def info_text(d: dict[str, Any]) -> str:
    lines = [f"store {d['location']}  (format {d['format_version']}, {len(d['variants'])} variant(s))"]
    for v in d["variants"]:
        env = v["provenance"].get("environment", {})
        rec = v["provenance"].get("recipe", {})
        k = env.get("kernels", {})
        ratio = f"{v['compression_ratio']:.2f}x" if v["compression_ratio"] else "-"
        lines += [
            "",
            f"variant {v['id']}: backend={env.get('backend')} dtype={env.get('dtype')} device={env.get('device')} "
            f"({env.get('device_name')})",
            f"  model {rec.get('model', {}).get('name')}  layers aux={rec.get('layers', {}).get('aux')} "
            f"target={rec.get('layers', {}).get('target')}  hidden={v['hidden_size']}",
            f"  kernels: gated-delta={k.get('chunk_gated_delta_rule')} conv1d={k.get('causal_conv1d')} "
            f"attention={k.get('attention')}",
            "  versions: " + ", ".join(f"{a}={b}" for a, b in env.get("versions", {}).items() if b),
            f"  {v['n_samples']:,} samples, {v['n_tokens']:,} tokens, {v['n_units']} units, "
            f"{_fmt_bytes(v['bytes'])} on disk, compression {ratio} ({v['codec']})",
            "  layer      mean       std    absmax  nan  inf  zero%",
        ]
        norm_id = rec.get("model", {}).get("num_layers") if rec.get("final_norm") else None
        for layer, h in sorted(v["health"].items(), key=lambda x: int(x[0])):
            lines.append(f"  {int(layer):5d} {h['mean']:9.4f} {h['std']:9.4f} {h['absmax']:9.3f} {h['nan']:4d} "
                         f"{h['inf']:4d} {100 * h['zero_fraction']:6.2f}"
                         + ("  (final norm)" if int(layer) == norm_id else ""))
        if v["unreadable_commits"]:
            lines.append(f"  WARNING: {v['unreadable_commits']} unreadable commit record(s); run hsstore verify")
    return "\n".join(lines)


def diff_text(r: dict[str, Any]) -> str:
    lines = [
        f"A: {r['a']}", f"B: {r['b']}",
        f"shared samples {r['shared_samples']:,} ({r['tokens']:,} tokens), only in A {r['only_a']:,}, "
        f"only in B {r['only_b']:,}",
    ]
    if r.get("floor"):
        lines.append(f"floor: {r['floor']}")
    head = " layer   mean_abs    max_abs    rel_l2  cos_mean   cos_min   cos_p01  bit_exact"
    head += "  floor_x" if r.get("floor") else ""
    lines.append(head)
    for L in r["layers"]:
        row = (f"{L['layer']:6d} {L['mean_abs']:10.3e} {L['max_abs']:10.3e} {L['rel_l2']:9.3e} {L['cos_mean']:9.6f} "
               f"{L['cos_min']:9.6f} {L['cos_p01']:9.6f} {L['bit_exact']:10.4f}")
        if r.get("floor"):
            row += f"  {L['floor_ratio']:7.2f}" if L.get("floor_ratio") is not None else "        -"
        lines.append(row)
        if L.get("verdict"):
            lines.append(f"        {L['verdict']}")
    if r.get("worst_samples"):
        lines.append("worst samples (rel-L2 at the deepest layer): " +
                     ", ".join(f"{w['key'][:12]}… {w['rel_l2']:.2e}" for w in r["worst_samples"][:5]))
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)

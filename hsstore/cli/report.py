"""Human-readable text of ``info``, ``verify`` and ``gc``, rendered from their records (``--json`` is the
record itself; diff: diff_render)."""

from __future__ import annotations

from hsstore.core.schema.gc_report import GcReport
from hsstore.core.schema.info_report import StoreInfo, VariantInfo
from hsstore.core.schema.provenance import Provenance
from hsstore.core.schema.record import is_set, or_none
from hsstore.core.schema.storage_report import StorageReport
from hsstore.core.schema.verify_report import VerifyReport
from hsstore.storage.audits import audit_line


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def info_text(d: StoreInfo) -> str:
    several = len(d.models) > 1
    lines = [f"store {d.location}  (format {d.format_version}, {len(d.variants)} variant(s)"
             + (f" of {len(d.models)} models)" if several else ")")]
    by_id = {v.id: v for v in d.variants}
    for group in d.models if several else []:  # a store of several models (--another-model): by model
        lines += ["", f"model {group.model}: {len(group.variants)} variant(s)"]
        for vid in group.variants:
            lines += ["", *_variant_lines(by_id[vid], d.location)]
    for v in [] if several else d.variants:
        lines += ["", *_variant_lines(v, d.location)]
    for g in d.generations:  # regenerating builds: their ledger of replies
        finish = ", ".join(f"{n} {k}" for k, n in sorted(g.finish.items()))
        lines += ["", f"regenerated replies of build {g.build_id}: {g.replies} ({finish}; {g.reused} reused from "
                      f"earlier runs, {g.dropped} dropped), {g.prompt_tokens:,} prompt + {g.reply_tokens:,} reply "
                      f"tokens; {'; '.join(g.engines)}"]
    return "\n".join(lines)


def _variant_lines(v: VariantInfo, location: str) -> list[str]:
    prov = Provenance.from_dict(v.provenance, f"variant {v.id}: provenance")
    env, rec, k = prov.environment, prov.recipe, prov.environment.kernels
    ratio = f"{v.compression_ratio:.2f}x" if v.compression_ratio else "-"
    shown = {f"backend={env.backend}", f"dtype={env.dtype}", f"device={env.device}", f"attention={k.attention}",
             f"precision={v.precision}"}
    lines = [
        f"variant {v.label + ' ' if v.label else ''}{v.id}: backend={env.backend} dtype={env.dtype} device={env.device}"
        + (f" ({env.device_name})" if or_none(env.device_name) else "") + f" attention={k.attention}"
        + (f" precision={v.precision}" if v.precision else "")
        + _apart({a: b for a, b in v.distinguished_by.items() if f"{a}={b}" not in shown}),
        *([f"  select as {location}#{v.selector}"] if v.selector else []),  # (absent from older documents)
        f"  model {rec.model.name}  layers aux={rec.layers.aux} target={rec.layers.target}  hidden={v.hidden_size}",
        f"  kernels: gated-delta={k.chunk_gated_delta_rule} conv1d={k.causal_conv1d} attention={k.attention}",
        "  versions: " + ", ".join(f"{a}={b}" for a, b in (or_none(env.versions) or {}).items() if b),
        f"  {v.n_samples:,} samples, {v.n_tokens:,} tokens, {v.n_units} units, "
        f"{_fmt_bytes(v.bytes)} on disk, compression {ratio} ({v.codec})",
        "  layer      mean       std    absmax  nan  inf  zero%",
    ]
    norm_id = or_none(rec.model.num_layers) if rec.final_norm is True else None
    for layer, h in sorted(v.health.items(), key=lambda x: int(x[0])):
        lines.append(f"  {int(layer):5d} {h.mean:9.4f} {h.std:9.4f} {h.absmax:9.3f} {h.nan:4d} "
                     f"{h.inf:4d} {100 * h.zero_fraction:6.2f}" + ("  (final norm)" if int(layer) == norm_id else ""))
    if is_set(v.storage) and v.storage is not None:
        lines += storage_lines(v.storage)
    for a in v.audits:
        lines.append(f"  {audit_line(a)}")
    if v.unreadable_commits:
        lines.append(f"  WARNING: {v.unreadable_commits} unreadable commit record(s); run hsstore verify")
    return lines


def _apart(fields: dict[str, str]) -> str:
    """The fields that tell a variant from the store's others (those the line does not show already)."""
    return "".join(f" {k}={v}" for k, v in fields.items())


def verify_text(r: VerifyReport) -> str:
    lines = [f"{'OK' if r.ok else 'FAILED'}: {r.samples_checked} samples checked, {len(r.problems)} problem(s)"]
    lines += [f"  {p.variant or '-'} {p.key or '-'}: {p.what}" for p in r.problems]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def gc_text(r: GcReport) -> str:
    verb = "would remove" if r.dry_run else "removed"
    lines = [f"{verb} {len(r.removed_units)} uncommitted unit(s) ({r.removed_files} files); "
             f"kept {len(r.kept_in_progress)} that may still be in progress"]
    if r.dry_run:
        lines += [f"  {u}" for u in r.removed_units]
    lines += [f"  not removed: {s.what}: {s.why}" for s in r.skipped]
    return "\n".join(lines)


def storage_lines(st: StorageReport) -> list[str]:
    """How an FP8 variant is stored and what it costs, against the bf16-vs-fp32 floor when there is one."""
    lines = [f"  stored as {st.precision} (scales {st.scale}), computed in {st.computed_dtype}"
             + (f"; converted from {st.source.variant}" if st.source else "; quantized at build time")]
    floor = st.floor
    head = "  layer  fp8 rel-L2  cos mean    cos min"
    if floor:
        head += f"  bf16-vs-fp32 floor  (floor on {floor.samples} samples, {floor.tokens:,} tokens)"
    lines.append(head)
    for layer, e in sorted(st.error.items(), key=lambda x: int(x[0])):
        row = f"  {int(layer):5d} {e.rel_l2:11.3e} {e.cos_mean:9.6f} {e.cos_min:10.6f}"
        ratio = (st.error_vs_floor or {}).get(layer)
        if floor and ratio is not None:
            row += f"  {floor.rel_l2[layer]:.3e} -> FP8 error {ratio:.2f}x the bf16-vs-fp32 floor"
        lines.append(row)
    if not floor:
        lines.append("  (no bf16 and fp32 variants of this recipe in the store: no floor to compare with)")
    return lines

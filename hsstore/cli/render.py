"""Every report a command prints goes through ``write_stdout``: all of it reaches stdout, or the command
fails in one line (exit 1) — a full disk, a file-size limit (``ulimit -f``: SIGXFSZ is ignored, so the
write comes back short) or a closed pipe never ends as a traceback or as exit 0 with the JSON cut off."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any

from hsstore.core.errors import BadInput, OutputFailed
from hsstore.core.outputs import PLOT_SUFFIXES
from hsstore.core.schema.provenance import Provenance
from hsstore.core.schema.record import UnsetType, is_set, or_none
from hsstore.core.schema.reports import (
    AlignReport,
    CheckReport,
    DiffReport,
    FieldDifference,
    GcReport,
    LayerDiff,
    StorageReport,
    StoreInfo,
    VariantInfo,
    VerifyReport,
)
from hsstore.storage.info import audit_line


def write_stdout(text: str) -> None:
    """Write ``text`` and a newline to stdout, every byte or OutputFailed naming how far it got."""
    data = (text + "\n").encode("utf-8", "surrogateescape")
    try:
        sys.stdout.flush()  # what typer or print() buffered goes first
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # a replaced stdout (tests' capture): its own write
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    done = 0
    view = memoryview(data)
    while done < len(data):
        try:
            n = os.write(fd, view[done:])
        except InterruptedError:
            continue
        except OSError as e:
            raise _failed(e.errno, e.strerror or str(e), done, len(data)) from None
        if n <= 0:
            raise _failed(errno.EFBIG, "nothing more could be written", done, len(data))
        done += n


def _failed(code: int | None, why: str, done: int, total: int) -> OutputFailed:
    if code == errno.EPIPE:  # the reader went away (`| head`): say so once, and stop writing there
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return OutputFailed(
            f"writing the report to stdout failed: the pipe was closed after {done} of {total} "
            "bytes; read the whole output or write it to a file"
        )
    return OutputFailed(
        f"writing the report to stdout failed after {done} of {total} bytes: {why}; the output "
        "is incomplete — free space or raise the file-size limit (ulimit -f), or write it elsewhere"
    )


# --- Human-readable text of ``info``, ``verify`` and ``gc``, rendered from their records (``--json`` is the


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def info_text(d: StoreInfo) -> str:
    several = len(d.models) > 1
    lines = [
        f"store {d.location}  (format {d.format_version}, {len(d.variants)} variant(s)"
        + (f" of {len(d.models)} models)" if several else ")")
    ]
    by_id = {v.id: v for v in d.variants}
    for group in d.models if several else []:  # a store of several models (--another-model): by model
        lines += ["", f"model {group.model}: {len(group.variants)} variant(s)"]
        for vid in group.variants:
            lines += ["", *_variant_lines(by_id[vid], d.location)]
    for v in [] if several else d.variants:
        lines += ["", *_variant_lines(v, d.location)]
    for g in d.generations:  # regenerating builds: their ledger of replies
        finish = ", ".join(f"{n} {k}" for k, n in sorted(g.finish.items()))
        lines += [
            "",
            f"regenerated replies of build {g.build_id}: {g.replies} ({finish}; {g.reused} reused from "
            f"earlier runs, {g.dropped} dropped), {g.prompt_tokens:,} prompt + {g.reply_tokens:,} reply "
            f"tokens; {'; '.join(g.engines)}; kernels: {'; '.join(g.kernels) or 'not recorded'}",
        ]
    return "\n".join(lines)


def _variant_lines(v: VariantInfo, location: str) -> list[str]:
    prov = Provenance.from_dict(v.provenance, f"variant {v.id}: provenance")
    env, rec, k = prov.environment, prov.recipe, prov.environment.kernels
    ratio = f"{v.compression_ratio:.2f}x" if v.compression_ratio else "-"
    shown = {
        f"backend={env.backend}",
        f"dtype={env.dtype}",
        f"device={env.device}",
        f"attention={k.attention}",
        f"precision={v.precision}",
    }
    lines = [
        f"variant {v.label + ' ' if v.label else ''}{v.id}: backend={env.backend} dtype={env.dtype} device={env.device}"
        + (f" ({env.device_name})" if or_none(env.device_name) else "")
        + f" attention={k.attention}"
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
        lines.append(
            f"  {int(layer):5d} {h.mean:9.4f} {h.std:9.4f} {h.absmax:9.3f} {h.nan:4d} "
            f"{h.inf:4d} {100 * h.zero_fraction:6.2f}" + ("  (final norm)" if int(layer) == norm_id else "")
        )
    if not isinstance(v.storage, UnsetType):
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
    if r.quarantined:
        lines.append(
            f"  quarantined {len(r.quarantined)} damaged unit(s) ({', '.join(r.quarantined)}): their samples "
            "read as never built; re-run the command that wrote them (the build, or `hsstore convert` for "
            "an FP8 copy) to compute them again, and `hsstore gc` removes their files"
        )
    elif r.damaged_units:
        lines.append(
            f"  fix: `hsstore verify STORE --quarantine` takes back the commit of the {len(r.damaged_units)} "
            "damaged unit(s) (their records kept under quarantine/), then re-running the command that wrote "
            "them (the build, or `hsstore convert` for an FP8 copy) computes their samples again"
        )
    return "\n".join(lines)


def gc_text(r: GcReport) -> str:
    verb = "would remove" if r.dry_run else "removed"
    lines = [
        f"{verb} {len(r.removed_units)} uncommitted unit(s) ({r.removed_files} files); "
        f"kept {len(r.kept_in_progress)} that may still be in progress"
    ]
    if r.dry_run:
        lines += [f"  {u}" for u in r.removed_units]
    lines += [f"  not removed: {s.what}: {s.why}" for s in r.skipped]
    return "\n".join(lines)


def storage_lines(st: StorageReport) -> list[str]:
    """How an FP8 variant is stored and what it costs, against the bf16-vs-fp32 floor when there is one."""
    lines = [
        f"  stored as {st.precision} (scales {st.scale}), computed in {st.computed_dtype}"
        + (f"; converted from {st.source.variant}" if st.source else "; quantized at build time")
    ]
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


# --- Human-readable text of the ``diff``, ``check`` and ``diff --align`` reports, rendered from their records


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
        lines.append(
            f"SAMPLED: {s.samples:,} of {s.population:,} shared samples ({s.fraction:.2%}, seed "
            f"{s.seed}, {s.strata} length strata); [lo, hi] = {s.confidence:.0%} intervals"
        )
    lines.append(
        f"shared samples {r.shared_samples:,} ({r.tokens:,} tokens compared), only in A "
        f"{r.only_a:,}, only in B {r.only_b:,}"
    )
    head = " layer   mean_abs    max_abs    rel_l2  cos_mean   cos_min   cos_p01  bit_exact"
    lines.append(head + ("  floor_x" if r.floor else ""))
    for L in r.layers:
        lines.append(
            f"{L.layer:6d} {L.mean_abs:10.3e} {L.max_abs:10.3e} {L.rel_l2:9.3e} {L.cos_mean:9.6f} "
            f"{L.cos_min:9.6f} {L.cos_p01:9.6f} {L.bit_exact:10.4f}" + (_floor_cell(L) if r.floor else "")
        )
        if L.ci:
            lines.append(
                f"        rel_l2{_ci(L, 'rel_l2', '.3e')}"
                + (f"  floor_x{_ci(L, 'floor_ratio', '.2f')}" if "floor_ratio" in L.ci else "")
            )
        if L.verdict:
            lines.append(f"        {L.verdict}")
    if r.worst_samples:
        lines.append(
            "worst samples (rel-L2 at the deepest layer): "
            + ", ".join(f"{w.key[:12]}… {w.rel_l2:.2e}" for w in r.worst_samples[:5])
        )
    lines += [f"note: {n}" for n in r.notes + (s.notes if s else [])]
    lines.append(f"verdict: {r.verdict}")
    return "\n".join(lines)


def check_text(r: CheckReport) -> str:
    lines = [
        f"model: {r.model}  (fingerprint {r.model_fingerprint[:16]}"
        + (", as recorded)" if r.same_model else f", recorded {r.recorded_model_fingerprint[:16]}: OTHER WEIGHTS)"),
        f"variant: {r.target}  ({r.variant}), {r.dtype} on {r.device}",
        f"recomputed {r.samples} samples ({r.tokens:,} tokens) in their {r.batches} recorded batch(es): {r.batching}",
    ]
    for d in r.environment_differences:
        lines.append(f"  differs from the record: {d.field}: {_value(d.a)} here, {_value(d.b)} recorded")
    lines.append(" layer    rel_l2   bit_exact   max_abs   cos_min" + ("  floor_x" if r.floor else ""))
    for L in r.layers:
        lines.append(
            f"{L.layer:6d} {L.rel_l2:9.3e} {L.bit_exact:10.6f} {L.max_abs:9.3e} {L.cos_min:9.6f}"
            + (_floor_cell(L) if r.floor else "")
        )
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"verdict: {r.verdict}")
    return "\n".join(lines)


def audit_text(r: CheckReport) -> str:
    """The audit: one verdict line, how it recomputed (and what it assumed), the bound, a table of samples
    by stored layer, then each finding."""
    rc = or_none(r.recompute) or {}
    lines = [
        f"verdict: {r.verdict}",
        f"variant: {r.target}  ({r.variant}); model {r.model} (fingerprint {r.model_fingerprint[:16]}"
        + (", as recorded)" if r.same_model else f", recorded {r.recorded_model_fingerprint[:16]})"),
        f"recomputed {r.samples} of {or_none(r.population)} samples ({r.tokens:,} tokens) with backend "
        f"{rc.get('backend')}, {rc.get('dtype')}, {rc.get('attention')} attention on {rc.get('device')}, "
        f"{r.batching}; floor: {r.floor if is_set(r.floor) else 'none'}",
    ]
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
    lines = [
        f"A: {r.a_target}  ({r.a}), capture {r.a_capture}",
        f"B: {r.b_target}  ({r.b})",
        f"matched each of A's layers against B's on {r.samples} shared samples ({r.tokens:,} tokens):",
    ]
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


# --- ``hsstore diff --plot``: per-layer rel-L2 and 1 - cosine of A against B and against the floor C,


def _name(target: str | None, variant: str | None, which: str) -> str:
    """How the legend names A, B or the floor: as the user named it (else its STORE#VARIANT_ID), shortened."""
    target = target or variant or which
    return target if len(target) <= 48 else "…" + target[-47:]


def _series(ax: Any, layers: list[int], rows: list[LayerDiff], key: str, label: str, style: str, color: str) -> None:
    values = [max(float(getattr(L, key) if key != "1-cos" else 1.0 - L.cos_mean), 1e-16) for L in rows]
    err = None
    ci_key = "cos_mean" if key == "1-cos" else key
    cis = [L.ci for L in rows if not isinstance(L.ci, UnsetType) and ci_key in L.ci]
    if len(cis) == len(rows):  # every row has the interval
        bounds = [sorted(1.0 - x for x in ci[ci_key]) if key == "1-cos" else ci[ci_key] for ci in cis]
        err = [
            [max(0.0, v - lo) for v, (lo, _) in zip(values, bounds)],
            [max(0.0, hi - v) for v, (_, hi) in zip(values, bounds)],
        ]
    ax.errorbar(layers, values, yerr=err, fmt=style, label=label, capsize=3, color=color)


def plot_diff(report: DiffReport, path: str) -> bytes:
    """The plot's file, in the format ``path``'s suffix names (PNG when it names none, e.g. /dev/stdout)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib: pip install matplotlib") from None
    layers = [L.layer for L in report.layers]
    a, b = _name(report.a_target, report.a, "a"), _name(report.b_target, report.b, "b")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _series(ax1, layers, report.layers, "rel_l2", f"A vs B\nA = {a}\nB = {b}", "o-", "C0")
    _series(ax2, layers, report.layers, "1-cos", "A vs B (mean over tokens)", "o-", "C0")
    ax2.plot(
        layers, [max(1.0 - L.cos_p01, 1e-16) for L in report.layers], "x:", color="C0", label="A vs B (99th percentile)"
    )
    if report.floor_layers:
        c = _name(or_none(report.floor_target), or_none(report.floor), "floor")
        _series(ax1, layers, report.floor_layers, "rel_l2", f"floor: A vs C\nC = {c}", "s--", "C1")
        _series(ax2, layers, report.floor_layers, "1-cos", "floor: A vs C (mean)", "s--", "C1")
    for ax, label in ((ax1, "relative L2  ‖A−B‖ / ‖B‖"), (ax2, "1 − cosine(A, B) per token")):
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.set_xticks(layers)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = report.verdict[:140]
    s = report.sampling
    if s:
        title += f"\nsampled {s.samples} of {s.population} samples (seed {s.seed}); bars: {s.confidence:.0%} intervals"
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    suffix = os.path.splitext(path)[1].lower()
    buf = io.BytesIO()
    fig.savefig(buf, format=suffix[1:] if suffix in PLOT_SUFFIXES else "png", dpi=100)
    plt.close(fig)
    return buf.getvalue()

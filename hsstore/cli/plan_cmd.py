"""`hsstore plan`: what a build will take, before it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from hsstore.cli.app import app, emit
from hsstore.cli.build_cmd import dropped_note
from hsstore.core.outputs import byte_size, duration
from hsstore.core.schema.plan import GenerationPlan, PlanReport, Space, Tokens, VariantPlan


@app.command()
def plan(
    manifest: Annotated[str, typer.Argument(help="Build manifest (TOML), e.g. manifests/tiny.toml.")],
    store: Annotated[str | None, typer.Option("--store", help="Store path or URL (overrides [store] path).")] = None,
    backend: Annotated[list[str] | None, typer.Option("--backend", help="torch | fla (repeatable).")] = None,
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 (repeatable).")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", help="cpu | cuda | cuda:N (repeatable).")] = None,
    codec: Annotated[
        str | None, typer.Option("--codec", help="none | zstd | shuffle-zstd | blosc-lz4 | blosc-zstd.")
    ] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="fp8-e4m3 to plan a quantized store.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Plan only the first N usable samples.")] = None,
    sample: Annotated[
        int | None,
        typer.Option("--sample", min=2, help="Tokenize N seeded rows, not all, and extrapolate (with a 95% interval)."),
    ] = None,
    calibrate: Annotated[
        int,
        typer.Option(
            "--calibrate",
            min=0,
            help="Run N batches through the model to measure codec ratios and tokens/s; with [generate], "
            "also generate the build's first batch twice (cold, then warm) to time the generation, whatever N.",
        ),
    ] = 0,
    peak_tflops: Annotated[
        float | None,
        typer.Option("--peak-tflops", min=0.001, help="The device's dense peak TFLOP/s for the time estimate."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Tokens, bytes per variant and layer, what the store holds already, free space and time of a build.

    Without --calibrate, codec ratios and the MFU are stated assumptions (docs/plan.md).

    Example: hsstore plan manifests/tiny.toml --calibrate 2
    """
    from hsstore.capture.inputs.manifest_file import load_manifest
    from hsstore.capture.plan.plan_report import make_plan
    from hsstore.core.outputs import expand_user

    m = load_manifest(manifest).with_overrides(
        store_path=expand_user(store) if store else store,
        backends=backend,
        dtypes=dtype,
        devices=device,
        codec=codec,
        precision=precision,
    )
    report = make_plan(m, limit=limit, sample=sample, calibrate=calibrate, peak_tflops=peak_tflops)
    emit(report, json_out, lambda r: "\n".join(_lines(r)))


def _lines(r: PlanReport) -> list[str]:
    """The text form of a plan."""
    inp = r.inputs
    rej = ", ".join(f"{k}: {v}" for k, v in inp.rejected.items()) or "none"
    lines = [
        f"plan of {r.manifest} into {r.store}",
        f"inputs: {inp.rows} rows read, {inp.usable} usable, {inp.truncated} truncated{dropped_note(inp)}, "
        f"{inp.duplicates} duplicate; rejected: {rej}",
        _tokens_line(r.tokens),
        f"model {r.model}: hidden {r.hidden_size}, layers {r.layers}; forward {r.flops_per_token:.3g} FLOPs/token",
    ]
    for v in r.variants:
        lines += _variant_lines(v)
    if r.generation is not None:
        lines.append(_generation_line(r.generation))
    lines.append(
        "storage forms, all samples: "
        + "; ".join(
            f"{f.form}/{f.codec} {byte_size(f.bytes)} ({f.ratio.value:.2f}x{'' if f.ratio.measured else ' assumed'})"
            for f in r.forms
        )
    )
    lines.append(_space_line(r.space))
    return lines


def _tokens_line(t: Tokens) -> str:
    """The tokens the build will compute, with the interval of the estimate when rows were sampled."""
    tok = f"tokens: {t.tokens:,} in {t.samples:,} samples (mean length {t.mean_length:.0f}, max {t.max_length})"
    if t.sampled_rows is not None:
        tok += (
            f"; estimated from {t.sampled_rows:,} sampled rows, {t.confidence:.0%} interval "
            f"{t.tokens_low:,}-{t.tokens_high:,}"
        )
    return tok


def _variant_lines(v: VariantPlan) -> list[str]:
    """One variant's size, what the store holds of it already, its codec ratio and its time."""
    per_layer = byte_size(max(v.bytes_per_layer.values()) if v.bytes_per_layer else 0)
    done = (
        f"{v.committed_samples:,} samples committed in {v.committed_variant}"
        if v.committed_variant
        else "nothing committed"
    )
    how = "measured" if v.ratio.measured else f"assumed: {v.ratio.source}"
    mfu = f", MFU {v.mfu:.2f}" if v.mfu is not None else ""
    return [
        f"variant {v.backend}/{v.dtype}/{v.device} stored {v.form}/{v.codec}: {byte_size(v.bytes)} in "
        f"{v.units} units, {per_layer} per layer; {done}; to write {byte_size(v.remaining_bytes)}",
        f"  codec ratio {v.ratio.value:.2f}x ({how})",
        f"  time: {duration(v.seconds)} for {v.flops:.3g} FLOPs{mfu} — {v.seconds_source}",
    ]


def _generation_line(g: GenerationPlan) -> str:
    """The replies a ``[generate]`` build regenerates first, and the time that takes."""
    rate = g.generated_tokens_per_second
    when = "" if g.seconds is None else duration(g.seconds) + (f" at {rate:,.1f} tokens/s" if rate is not None else "")
    ck = f" ({g.checkpointed_replies:,} checkpointed in the store: reused)" if g.checkpointed_replies else ""
    return (
        f"regenerating ({g.engine}): {g.replies:,} replies to {g.prompts:,} prompts{ck}, about "
        f"{g.expected_generated_tokens:,} generated tokens (at most {g.max_generated_tokens:,}) in "
        f"{g.batches:,} batch(es); "
        f"time: {when or '?'} — {g.seconds_source}; the sizes are of the replies the store holds, and "
        "of the data's own (of max_new_tokens where it has none) for the replies still to generate"
    )


def _space_line(s: Space) -> str:
    """Whether the build fits the free space of a local store's disk (an object store's is not checked)."""
    if not s.local:
        return (
            f"space: {s.path} is an object store: free space unknown (not checked); "
            f"the build writes {byte_size(s.needed_bytes)}"
        )
    verdict = "fits" if s.fits else "does NOT fit (hsstore build will refuse; free space or use another --store)"
    if (words := s.limit_words()) is not None:
        verdict = f"does NOT fit (hsstore build will refuse): {words}"
    return f"space: {s.path} has {byte_size(s.free_bytes)} free; the build needs {byte_size(s.needed_bytes)}: {verdict}"

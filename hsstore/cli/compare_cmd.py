"""`hsstore diff`: comparing two variants."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from hsstore.cli.app import app, json_text
from hsstore.core.errors import BadInput, CheckFailed
from hsstore.core.outputs import PLOT_SUFFIXES, check_distinct_outputs, check_not_an_input, check_output_file
from hsstore.storage.store import check_outside_stores

if TYPE_CHECKING:
    from hsstore.compare.audit import AuditRequest
    from hsstore.compare.diff import DiffRequest
    from hsstore.core.schema.record import Record
    from hsstore.core.schema.reports import DiffReport

R = TypeVar("R", bound="Record")


def _emit(report: R, json_path: str | None, render: Callable[[R], str]) -> None:
    """The report as JSON on stdout (``-``), or as text rendered from it (and JSON to a file)."""
    from hsstore.cli.render import write_stdout

    if json_path == "-":
        write_stdout(json_text(report))
        return
    write_stdout(render(report))
    if json_path:
        from hsstore.storage.fileio import write_output_file

        write_output_file(json_path, json_text(report).encode(), "--json")


# `hsstore diff`'s and `hsstore check`'s arguments and options, one alias each (those the two share first)
JsonPath = Annotated[str | None, typer.Option("--json", help="Write the JSON report here ('-' = stdout).")]
Noise = Annotated[float, typer.Option("--noise", help="Divergence up to this multiple of the floor is noise.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the sample choice.")]
VariantA = Annotated[str, typer.Argument(help="STORE#SELECTOR of the first variant.")]
VariantB = Annotated[str, typer.Argument(help="STORE#SELECTOR of the second variant (the reference).")]
DiffFloor = Annotated[str | None, typer.Option("--floor", help="STORE#SELECTOR of a precision floor (e.g. fp32).")]
Layers = Annotated[list[int] | None, typer.Option("--layers", help="Only these layers (repeatable).")]
LossOnly = Annotated[bool, typer.Option("--loss-only", help="Only loss-masked tokens.")]
Plot = Annotated[str | None, typer.Option("--plot", help="Write a PNG plot here.")]
DiffMaxRel = Annotated[float | None, typer.Option("--max-rel", help="Exit 1 if any layer's rel-L2 exceeds this.")]
DiffDevice = Annotated[str, typer.Option("--device", help="Where to do the arithmetic (cpu | cuda | cuda:N).")]
Threads = Annotated[int | None, typer.Option("--threads", min=1, help="Worker threads (default: every core).")]
DiffSamples = Annotated[
    int | None,
    typer.Option(
        "--samples", help="Compare a seeded, length-stratified choice of N shared samples, with confidence intervals."
    ),
]
DiffFraction = Annotated[
    float | None, typer.Option("--fraction", help="Like --samples, as a fraction of the shared samples (e.g. 0.01).")
]
Confidence = Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")]
AllowDifferentModels = Annotated[
    bool,
    typer.Option(
        "--allow-different-models",
        help="Compare states of different models or tokenizers (refused by default: their divergence says nothing about precision).",
    ),
]
Align = Annotated[
    bool,
    typer.Option(
        "--align",
        help="Match each of A's layers against B's layers and capture points (output of i, input of i = output of i-1, pre/post final norm) and name off-by-one and pre/post-norm mismatches. Automatic when A's capture point is unknown.",
    ),
]
Model = Annotated[
    str, typer.Argument(help="The model: a local HF model directory, builtin:NAME, or the build manifest (.toml).")
]
Target = Annotated[str, typer.Argument(help="STORE#SELECTOR of the variant to check (native or imported).")]
CheckSamples = Annotated[
    int | None,
    typer.Option(
        "--samples", min=1, help="Stored samples to recompute (a seeded, length-stratified choice; default 8)."
    ),
]
CheckFraction = Annotated[
    float | None,
    typer.Option("--fraction", help="Like --samples, as a fraction of the variant's samples (e.g. 0.01); an audit."),
]
Keys = Annotated[
    str | None,
    typer.Option(
        "--keys",
        help="Check these samples: keys (or unique prefixes), comma-separated, e.g. the ones verify or an earlier audit named; an audit.",
    ),
]
CheckDevice = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="Where to run the model (default: the recorded device type; unknown: cuda if visible, else cpu).",
    ),
]
CheckFloor = Annotated[
    str | None,
    typer.Option(
        "--floor",
        help="STORE#SELECTOR of a precision floor (e.g. the fp32 variant), or 'live': recompute the samples in fp32 too (the default for an imported variant).",
    ),
]
Backend = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="torch | fla, where the provenance says unknown (default: fla on a GPU where installed, else torch).",
    ),
]
Dtype = Annotated[
    str | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 to recompute in (default: the stored dtype).")
]
Attn = Annotated[str | None, typer.Option("--attn", help="Attention implementation where unknown (default: sdpa).")]
TokenBudget = Annotated[
    int | None,
    typer.Option(
        "--token-budget",
        help="Recompute in hsstore's token-budget batches of N padded tokens (default for an import: each sample alone).",
    ),
]
CheckMaxRel = Annotated[
    float | None,
    typer.Option("--max-rel", help="Pass when every layer's rel-L2 is at most this (instead of the verdict)."),
]


def _check_options(
    json_path: str | None,
    noise: float,
    max_rel: float | None,
    inputs: dict[str, str] | None = None,
    plot: str | None = None,
) -> None:
    """Refuse, before any work, a report (or ``plot``) path that cannot be written (or would replace a file of
    one of ``inputs``, or the other output) and thresholds that compare nothing."""
    if json_path is not None and json_path != "-":  # (an empty --json is refused, not taken for "no report")
        check_outside_stores(json_path, "--json")
        check_output_file(json_path, "--json")
        check_not_an_input(json_path, "--json", inputs or {})
    if not (math.isfinite(noise) and noise > 0):
        raise BadInput(f"--noise {noise}: must be a positive number (a multiple of the floor), e.g. 2")
    if max_rel is not None and not (math.isfinite(max_rel) and max_rel >= 0):
        raise BadInput(f"--max-rel {max_rel}: must be a number >= 0 (a relative L2 bound), e.g. 0.01")
    if plot is not None:
        check_outside_stores(plot, "--plot")
        check_output_file(plot, "--plot", PLOT_SUFFIXES)
        check_distinct_outputs({"--json": json_path, "--plot": plot})


@app.command()
def diff(
    a: VariantA,
    b: VariantB,
    floor: DiffFloor = None,
    layers: Layers = None,
    loss_only: LossOnly = False,
    json_path: JsonPath = None,
    plot: Plot = None,
    max_rel: DiffMaxRel = None,
    noise: Noise = 2.0,
    device: DiffDevice = "cpu",
    threads: Threads = None,
    samples: DiffSamples = None,
    fraction: DiffFraction = None,
    seed: Seed = 0,
    confidence: Confidence = 0.95,
    allow_different_models: AllowDifferentModels = False,
    align: Align = False,
) -> None:
    """Per-layer divergence of two variants over all shared samples, with a verdict against a floor.

    Example: hsstore diff 'out/tiny.zarr#dtype=bf16' 'out/tiny.zarr#backend=fla,dtype=bf16' --floor 'out/tiny.zarr#dtype=fp32'

    A 10 TB pair in minutes: add --fraction 0.01 (every statistic then gets a confidence interval).
    """
    from hsstore.compare.align import should_align
    from hsstore.compare.diff import DiffRequest, open_target, run_diff

    _check_options(json_path, noise, max_rel, plot=plot)
    request = DiffRequest(
        a_target=a,
        b_target=b,
        floor=floor,
        layers=layers or None,
        loss_only=loss_only,
        noise_factor=noise,
        device=device,
        threads=threads,
        samples=samples,
        fraction=fraction,
        seed=seed,
        confidence=confidence,
        allow_different_models=allow_different_models,
    )
    a_reader = open_target(a)  # opened once: asked whether to align, then diffed
    if align or should_align(a_reader):
        _align(request, json_path, auto=not align)
        return
    _report_diff(run_diff(request, a_reader), json_path, plot, max_rel)


def _align(r: DiffRequest, json_path: str | None, auto: bool) -> None:
    """Match the layers of ``r``'s A against B's layers and capture points (``--align``, or ``auto`` for an A of
    unknown capture point) and print the report; fail (exit 1) when a layer is not what its label says."""
    from hsstore.cli.render import align_text
    from hsstore.compare.align import run_align

    rep = run_align(
        r.a_target, r.b_target, r.samples, r.fraction, r.seed, r.threads, r.device, r.allow_different_models, auto=auto
    )
    _emit(rep, json_path, align_text)
    if not rep.ok:  # a layer that is not what its label says is a failed check (exit 1)
        raise CheckFailed(f"A's layers are not what their labels say: {rep.summary}")


def _report_diff(report: DiffReport, json_path: str | None, plot: str | None, max_rel: float | None) -> None:
    """Print the report (and write ``--json``), then write ``--plot``, then fail (exit 1) when a layer's rel-L2
    exceeds ``--max-rel``."""
    from hsstore.cli.render import diff_text

    _emit(report, json_path, diff_text)
    if plot:
        from hsstore.cli.render import plot_diff
        from hsstore.storage.fileio import write_output_file

        write_output_file(plot, plot_diff(report, plot), "--plot")
    if max_rel is not None:
        over = [layer for layer in report.layers if not layer.rel_l2 <= max_rel]  # (a NaN passes no bound)
        if over:
            worst = max(over, key=lambda layer: math.inf if math.isnan(layer.rel_l2) else layer.rel_l2)
            raise CheckFailed(f"rel-L2 {worst.rel_l2:.3g} at layer {worst.layer} exceeds --max-rel {max_rel:g}")


@app.command()
def check(
    model: Model,
    target: Target,
    samples: CheckSamples = None,
    fraction: CheckFraction = None,
    keys: Keys = None,
    seed: Seed = 0,
    device: CheckDevice = None,
    floor: CheckFloor = None,
    backend: Backend = None,
    dtype: Dtype = None,
    attn: Attn = None,
    token_budget: TokenBudget = None,
    noise: Noise = 2.0,
    max_rel: CheckMaxRel = None,
    json_path: JsonPath = None,
) -> None:
    """Recompute stored samples with a model in this process and compare per layer. On an imported variant
    (or with --floor live, --backend, --dtype, --attn, --token-budget, --fraction, --keys) it is an audit: every checked
    sample and layer is named bit-exact, within noise, or by its defect (NaN/Inf/zero/constant rows, capture
    point, token shift, suffix states, stale copy, aux = target, other weights, beyond noise), and the report
    says what the n samples bound. Exit 1 unless every checked sample agrees (or within --max-rel).

    Example: hsstore check builtin:tiny-qwen3_5 'out/tiny.zarr#dtype=bf16' --samples 8

    Example: hsstore check ./Qwen3-8B imported.zarr --fraction 0.01 --device cuda --json audit.json
    """
    from hsstore.compare.audit import AuditRequest
    from hsstore.compare.sampling import check_sampling

    _check_options(json_path, noise, max_rel, inputs={"the model": model})
    check_sampling(samples, fraction, 0.95)
    request = AuditRequest(
        model=model,
        target=target,
        samples=samples,
        fraction=fraction,
        seed=seed,
        floor=floor,
        noise_factor=noise,
        backend=backend,
        dtype=dtype,
        device=device,
        attention=attn,
        token_budget=token_budget,
        keys=None if keys is None else keys.split(","),
    )
    _run_check(request, json_path, max_rel)


def _run_check(r: AuditRequest, json_path: str | None, max_rel: float | None) -> None:
    """Run the audit ``r`` asks for (of an imported variant, or with an audit's option), else the plain check,
    and print its report; fail (exit 1) unless every layer is within ``max_rel``, or, without it, unless the
    verdict says the states match."""
    from hsstore.cli.render import audit_text, check_text
    from hsstore.compare.audit import run_audit, wants_audit
    from hsstore.compare.check import run_check
    from hsstore.compare.diff import open_target

    if wants_audit(open_target(r.target), r):
        report, render = run_audit(r), audit_text
    else:
        report, render = run_check(r.model, r.target, r.samples, r.seed, r.device, r.floor, r.noise_factor), check_text
    _emit(report, json_path, render)
    worst = max((layer.rel_l2 for layer in report.layers), default=0.0)
    if max_rel is not None:
        if not worst <= max_rel:
            raise CheckFailed(f"rel-L2 {worst:.3g} exceeds --max-rel {max_rel:g}")
    elif report.verdict_kind not in ("identical", "within_noise"):
        raise CheckFailed(f"live states do not match the store: {report.verdict}")

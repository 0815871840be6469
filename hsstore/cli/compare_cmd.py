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


def _check_numbers(
    json_path: str | None, noise: float, max_rel: float | None, inputs: dict[str, str] | None = None
) -> None:
    """Refuse, before any work, a report path that cannot be written (or would replace a file of one of
    ``inputs``) and thresholds that compare nothing."""
    if json_path is not None and json_path != "-":  # (an empty --json is refused, not taken for "no report")
        check_outside_stores(json_path, "--json")
        check_output_file(json_path, "--json")
        check_not_an_input(json_path, "--json", inputs or {})
    if not (math.isfinite(noise) and noise > 0):
        raise BadInput(f"--noise {noise}: must be a positive number (a multiple of the floor), e.g. 2")
    if max_rel is not None and not (math.isfinite(max_rel) and max_rel >= 0):
        raise BadInput(f"--max-rel {max_rel}: must be a number >= 0 (a relative L2 bound), e.g. 0.01")


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="STORE#SELECTOR of the first variant.")],
    b: Annotated[str, typer.Argument(help="STORE#SELECTOR of the second variant (the reference).")],
    floor: Annotated[
        str | None, typer.Option("--floor", help="STORE#SELECTOR of a precision floor (e.g. fp32).")
    ] = None,
    layers: Annotated[list[int] | None, typer.Option("--layers", help="Only these layers (repeatable).")] = None,
    loss_only: Annotated[bool, typer.Option("--loss-only", help="Only loss-masked tokens.")] = False,
    json_path: Annotated[str | None, typer.Option("--json", help="Write the JSON report here ('-' = stdout).")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a PNG plot here.")] = None,
    max_rel: Annotated[
        float | None, typer.Option("--max-rel", help="Exit 1 if any layer's rel-L2 exceeds this.")
    ] = None,
    noise: Annotated[
        float, typer.Option("--noise", help="Divergence up to this multiple of the floor is noise.")
    ] = 2.0,
    device: Annotated[str, typer.Option("--device", help="Where to do the arithmetic (cpu | cuda | cuda:N).")] = "cpu",
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Worker threads (default: every core).")
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            help="Compare a seeded, length-stratified choice of N shared samples, with confidence intervals.",
        ),
    ] = None,
    fraction: Annotated[
        float | None,
        typer.Option("--fraction", help="Like --samples, as a fraction of the shared samples (e.g. 0.01)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample choice.")] = 0,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
    allow_different_models: Annotated[
        bool,
        typer.Option(
            "--allow-different-models",
            help="Compare states of different models or tokenizers (refused by default: their divergence says nothing about precision).",
        ),
    ] = False,
    align: Annotated[
        bool,
        typer.Option(
            "--align",
            help="Match each of A's layers against B's layers and capture points (output of i, input of i = output of i-1, pre/post final norm) and name off-by-one and pre/post-norm mismatches. Automatic when A's capture point is unknown.",
        ),
    ] = False,
) -> None:
    """Per-layer divergence of two variants over all shared samples, with a verdict against a floor.

    Example: hsstore diff 'out/tiny.zarr#dtype=bf16' 'out/tiny.zarr#backend=fla,dtype=bf16' --floor 'out/tiny.zarr#dtype=fp32'

    A 10 TB pair in minutes: add --fraction 0.01 (every statistic then gets a confidence interval).
    """
    from hsstore.cli.render import align_text, diff_text
    from hsstore.compare.align import run_align, should_align
    from hsstore.compare.diff import DiffRequest, open_target, run_diff

    _check_numbers(json_path, noise, max_rel)
    if plot is not None:
        check_outside_stores(plot, "--plot")
        check_output_file(plot, "--plot", PLOT_SUFFIXES)
        check_distinct_outputs({"--json": json_path, "--plot": plot})
    a_reader = open_target(a)  # opened once: asked whether to align, then diffed
    if align or should_align(a_reader):
        rep = run_align(a, b, samples, fraction, seed, threads, device, allow_different_models, auto=not align)
        _emit(rep, json_path, align_text)
        if not rep.ok:  # a layer that is not what its label says is a failed check (exit 1)
            raise CheckFailed(f"A's layers are not what their labels say: {rep.summary}")
        return
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
    report = run_diff(request, a_reader)
    _emit(report, json_path, diff_text)
    _plot_and_bound(report, plot, max_rel)


def _plot_and_bound(report: DiffReport, plot: str | None, max_rel: float | None) -> None:
    """After the report is out: write ``--plot``, then fail (exit 1) when a layer's rel-L2 exceeds ``--max-rel``."""
    if plot:
        from hsstore.cli.render import plot_diff
        from hsstore.storage.fileio import write_output_file

        write_output_file(plot, plot_diff(report, plot), "--plot")
    if max_rel is not None:
        worst = max(layer.rel_l2 for layer in report.layers)
        if worst > max_rel:
            raise CheckFailed(f"rel-L2 {worst:.3g} exceeds --max-rel {max_rel:g}")


@app.command()
def check(
    model: Annotated[
        str, typer.Argument(help="The model: a local HF model directory, builtin:NAME, or the build manifest (.toml).")
    ],
    target: Annotated[str, typer.Argument(help="STORE#SELECTOR of the variant to check (native or imported).")],
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples", min=1, help="Stored samples to recompute (a seeded, length-stratified choice; default 8)."
        ),
    ] = None,
    fraction: Annotated[
        float | None,
        typer.Option(
            "--fraction", help="Like --samples, as a fraction of the variant's samples (e.g. 0.01); an audit."
        ),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Check these samples: keys (or unique prefixes), comma-separated, e.g. the ones verify or an earlier audit named; an audit.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample choice.")] = 0,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="Where to run the model (default: the recorded device type; unknown: cuda if visible, else cpu).",
        ),
    ] = None,
    floor: Annotated[
        str | None,
        typer.Option(
            "--floor",
            help="STORE#SELECTOR of a precision floor (e.g. the fp32 variant), or 'live': recompute the samples in fp32 too (the default for an imported variant).",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="torch | fla, where the provenance says unknown (default: fla on a GPU where installed, else torch).",
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 to recompute in (default: the stored dtype).")
    ] = None,
    attn: Annotated[
        str | None, typer.Option("--attn", help="Attention implementation where unknown (default: sdpa).")
    ] = None,
    token_budget: Annotated[
        int | None,
        typer.Option(
            "--token-budget",
            help="Recompute in hsstore's token-budget batches of N padded tokens (default for an import: each sample alone).",
        ),
    ] = None,
    noise: Annotated[
        float, typer.Option("--noise", help="Divergence up to this multiple of the floor is noise.")
    ] = 2.0,
    max_rel: Annotated[
        float | None,
        typer.Option("--max-rel", help="Pass when every layer's rel-L2 is at most this (instead of the verdict)."),
    ] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="Write the JSON report here ('-' = stdout).")] = None,
) -> None:
    """Recompute stored samples with a model in this process and compare per layer. On an imported variant
    (or with --floor live, --backend, --dtype, --attn, --token-budget, --fraction, --keys) it is an audit: every checked
    sample and layer is named bit-exact, within noise, or by its defect (NaN/Inf/zero/constant rows, capture
    point, token shift, suffix states, stale copy, aux = target, other weights, beyond noise), and the report
    says what the n samples bound. Exit 1 unless every checked sample agrees (or within --max-rel).

    Example: hsstore check builtin:tiny-qwen3_5 'out/tiny.zarr#dtype=bf16' --samples 8

    Example: hsstore check ./Qwen3-8B imported.zarr --fraction 0.01 --device cuda --json audit.json
    """
    from hsstore.cli.render import audit_text, check_text
    from hsstore.compare.audit import AuditRequest, run_audit, wants_audit
    from hsstore.compare.check import run_check
    from hsstore.compare.diff import open_target
    from hsstore.compare.sampling import check_sampling

    _check_numbers(json_path, noise, max_rel, inputs={"the model": model})
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
    if wants_audit(open_target(target), request):
        report, render = run_audit(request), audit_text
    else:
        report, render = run_check(model, target, samples, seed, device, floor, noise), check_text
    _emit(report, json_path, render)
    worst = max((layer.rel_l2 for layer in report.layers), default=0.0)
    if max_rel is not None:
        if not worst <= max_rel:
            raise CheckFailed(f"rel-L2 {worst:.3g} exceeds --max-rel {max_rel:g}")
    elif report.verdict_kind not in ("identical", "within_noise"):
        raise CheckFailed(f"live states do not match the store: {report.verdict}")

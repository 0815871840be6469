"""`hsstore diff`: comparing two variants."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from hsstore.cli.app import app
from hsstore.core.errors import CheckFailed


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="STORE#SELECTOR of the first variant.")],
    b: Annotated[str, typer.Argument(help="STORE#SELECTOR of the second variant (the reference).")],
    floor: Annotated[Optional[str], typer.Option("--floor", help="STORE#SELECTOR of a precision floor (e.g. fp32).")] = None,
    layers: Annotated[Optional[list[int]], typer.Option("--layers", help="Only these layers (repeatable).")] = None,
    loss_only: Annotated[bool, typer.Option("--loss-only", help="Only loss-masked tokens.")] = False,
    json_path: Annotated[Optional[str], typer.Option("--json", help="Write the JSON report here ('-' = stdout).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG plot here.")] = None,
    max_rel: Annotated[Optional[float], typer.Option("--max-rel", help="Exit 1 if any layer's rel-L2 exceeds this.")] = None,
    noise: Annotated[float, typer.Option("--noise", help="Divergence up to this multiple of the floor is noise.")] = 2.0,
    device: Annotated[str, typer.Option("--device", help="Where to do the arithmetic (cpu | cuda | cuda:N).")] = "cpu",
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="Worker threads (default: every core).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", help="Compare a seeded, length-stratified choice of N shared samples, with confidence intervals.")] = None,
    fraction: Annotated[Optional[float], typer.Option("--fraction", help="Like --samples, as a fraction of the shared samples (e.g. 0.01).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample choice.")] = 0,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the intervals.")] = 0.95,
    allow_different_models: Annotated[bool, typer.Option("--allow-different-models", help="Compare states of different models or tokenizers (refused by default: their divergence says nothing about precision).")] = False,
) -> None:
    """Per-layer divergence of two variants over all shared samples, with a verdict against a floor.

    Example: hsstore diff 'out/tiny.zarr#dtype=bf16' 'out/tiny.zarr#backend=fla,dtype=bf16' --floor 'out/tiny.zarr#dtype=fp32'

    A 10 TB pair in minutes: add --fraction 0.01 (every statistic then gets a confidence interval).
    """
    from hsstore.cli.diff_render import diff_text
    from hsstore.compare.diff import diff_targets

    report = diff_targets(a, b, floor, layers or None, loss_only, noise, device, threads, samples=samples,
                          fraction=fraction, seed=seed, confidence=confidence,
                          allow_different_models=allow_different_models)
    if json_path == "-":
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        typer.echo(diff_text(report))
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=2, sort_keys=True)
    if plot:
        from hsstore.compare.plot import plot_diff

        plot_diff(report, plot)
    if max_rel is not None:
        worst = max(layer["rel_l2"] for layer in report["layers"])
        if worst > max_rel:
            raise CheckFailed(f"rel-L2 {worst:.3g} exceeds --max-rel {max_rel:g}")

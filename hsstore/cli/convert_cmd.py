"""`hsstore convert`: derive a variant of another storage precision from a stored one (no model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hsstore.cli.app import app, emit

if TYPE_CHECKING:
    from hsstore.core.schema.convert_report import ConvertReport


def convert_text(r: ConvertReport) -> str:
    lines = [f"{r.source} -> {r.store}#{r.variant} ({r.precision}, codec {r.codec})",
             f"converted {r.samples_converted:,} samples ({r.tokens:,} tokens, {r.bytes / 1e6:,.1f} MB) in "
             f"{r.seconds:.1f} s on {r.workers} thread(s); {r.samples_present:,} were there already"
             + ("" if r.complete else "; NOT complete: re-run the same command to finish"),
             " layer    rel_l2  cos_mean   cos_min    max_abs   (storage error against the source, all samples)"]
    for layer, e in sorted(r.error.items(), key=lambda x: int(x[0])):
        lines.append(f"{int(layer):6d} {e.rel_l2:9.3e} {e.cos_mean:9.6f} {e.cos_min:9.6f} {e.max_abs:10.3e}")
    return "\n".join(lines)


@app.command()
def convert(
    target: Annotated[str, typer.Argument(help="STORE#SELECTOR of a variant stored as computed (bf16/fp16/fp32).")],
    precision: Annotated[str, typer.Option("--precision", help="Storage precision of the new variant: fp8-e4m3.")],
    store: Annotated[str | None, typer.Option("--store", help="Write the new variant here (default: the same store).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Units converted side by side (default: up to 4).")] = None,
    codec: Annotated[str | None, typer.Option("--codec", help="Compression of the new variant (default: the source's).")] = None,
    allow_unhealthy: Annotated[bool, typer.Option("--allow-unhealthy", help="Store NaN/Inf/all-zero states anyway.")] = False,
    label: Annotated[str | None, typer.Option("--label", help="Name the new variant: select it as STORE#LABEL.")] = None,
    another_model: Annotated[bool, typer.Option(
        "--another-model", help="Let this model into a --store that holds another model's states.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="Print nothing while the conversion runs (no progress, no phase lines: a long conversion is silent for minutes); errors and the final summary still print.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Derive an FP8 variant from a stored one, streaming and resumable, with its storage error measured.

    Example: hsstore convert 'out/tiny.zarr#dtype=bf16' --precision fp8-e4m3
    """
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from hsstore.storage.convert import convert as run_convert

    # the bar on a terminal's stderr only: stdout holds the report alone
    bar = Progress(TextColumn("convert"), BarColumn(), TextColumn("{task.completed}/{task.total} samples"),
                   transient=True, disable=quiet or json_out or not sys.stderr.isatty(), console=Console(stderr=True))
    with bar:
        task = bar.add_task("convert", total=None)
        r = run_convert(target, precision, store, workers, allow_unhealthy,
                        on_progress=lambda done, total: bar.update(task, completed=done, total=total), codec=codec,
                        label=label, another_model=another_model)
    emit(r.to_dict(), json_out, convert_text(r))
    if not r.complete:
        raise typer.Exit(1)

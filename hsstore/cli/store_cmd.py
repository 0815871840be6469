"""`hsstore info`, `verify` and `gc`: looking after a store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hsstore.cli.app import app, emit
from hsstore.storage.layout import UNIT_GRACE_SECONDS

if TYPE_CHECKING:
    from rich.progress import Progress

    from hsstore.core.schema.reports import ConvertReport


def _whole_store(target: str, command: str) -> str:
    """The store path of ``target``; BadInput if it names a variant (these commands read a whole store, and a
    selector dropped in silence would hide a typo in it)."""
    from hsstore.core.errors import BadInput
    from hsstore.storage.store import split_target

    path, selector = split_target(target)
    if selector is not None:
        raise BadInput(f"hsstore {command} reads a whole store, not one variant: pass {path!r} without '#{selector}'")
    return path


@app.command()
def info(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Variants with provenance, samples, tokens, bytes, compression and per-layer health.

    Example: hsstore info out/tiny.zarr --json
    """
    from hsstore.cli.render import info_text
    from hsstore.storage.info import store_info
    from hsstore.storage.store import Store

    r = store_info(Store.open(_whole_store(store, "info")))
    emit(r, json_out, info_text)


@app.command()
def verify(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
    quarantine: Annotated[
        bool,
        typer.Option(
            "--quarantine",
            help="Take back the commit of each unit whose files fail their checks (kept under quarantine/): its samples read as never built, and re-running the build that wrote them computes them again.",
        ),
    ] = False,
) -> None:
    """Check every checksum, sample, token key and layer; name each bad sample (exit 1 if any).

    Example: hsstore verify out/tiny.zarr
    """
    from hsstore.cli.render import verify_text
    from hsstore.storage.store import Store
    from hsstore.storage.verify import verify as run_verify

    r = run_verify(Store.open(_whole_store(store, "verify"), mode="a" if quarantine else "r"), quarantine=quarantine)
    emit(r, json_out, verify_text)
    if not r.ok:
        raise typer.Exit(1)


@app.command()
def gc(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds before another host's uncommitted unit is debris.")
    ] = UNIT_GRACE_SECONDS,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Remove every uncommitted unit whose writer does not hold it (local stores: running writers keep theirs; object stores: only when no writer runs).",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Remove uncommitted debris of crashed writers; committed data is never touched, symlinks are never
    followed.

    Example: hsstore gc out/tiny.zarr --dry-run
    """
    from hsstore.cli.render import gc_text
    from hsstore.storage.gc import collect_garbage
    from hsstore.storage.store import Store

    r = collect_garbage(Store.open(_whole_store(store, "gc"), mode="a"), grace, force, dry_run)
    emit(r, json_out, gc_text)


@app.command()
def label(
    target: Annotated[str, typer.Argument(help="STORE#SELECTOR of the variant to name.")],
    new_label: Annotated[str, typer.Argument(help="Its label (letters, digits, '_', '-', '.'), unique in the store.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Give a variant a label, or change it; no data is rewritten, and the change is kept in the store's
    history. Refused if another variant holds the label.

    Example: hsstore label 'out/tiny.zarr#dtype=bf16' sdpa-bf16
    """
    from hsstore.core.schema.reports import LabelChange
    from hsstore.core.selectors import label_selector
    from hsstore.storage.names import check_label
    from hsstore.storage.store import Store, split_target

    path, selector = split_target(target)
    check_label(new_label)
    store = Store.open(path, mode="a")
    vid = store.select(selector)
    previous = store.set_label(vid, new_label, by="label")
    said = "unchanged" if previous == new_label else f"was {previous!r}" if previous else "was unlabelled"
    emit(
        LabelChange(store=path, variant=vid, label=new_label, previous=previous),
        json_out,
        lambda r: (
            f"variant {r.variant} labelled {r.label!r} ({said}); select it as {r.store}#{label_selector(r.label)}"
        ),
    )


# --- `hsstore convert`: derive a variant of another storage precision from a stored one (no model).


def convert_text(r: ConvertReport) -> str:
    lines = [
        f"{r.source} -> {r.store}#{r.variant} ({r.precision}, codec {r.codec})",
        f"converted {r.samples_converted:,} samples ({r.tokens:,} tokens, {r.bytes / 1e6:,.1f} MB) in "
        f"{r.seconds:.1f} s on {r.workers} thread(s); {r.samples_present:,} were there already"
        + ("" if r.complete else "; NOT complete: re-run the same command to finish"),
        " layer    rel_l2  cos_mean   cos_min    max_abs   (storage error against the source, all samples)",
    ]
    for layer, e in sorted(r.error.items(), key=lambda x: int(x[0])):
        lines.append(f"{int(layer):6d} {e.rel_l2:9.3e} {e.cos_mean:9.6f} {e.cos_min:9.6f} {e.max_abs:10.3e}")
    return "\n".join(lines)


# `hsstore convert`'s arguments and options, one alias each
ConvertSource = Annotated[str, typer.Argument(help="STORE#SELECTOR of a variant stored as computed (bf16/fp16/fp32).")]
Precision = Annotated[str, typer.Option("--precision", help="Storage precision of the new variant: fp8-e4m3.")]
IntoStore = Annotated[str | None, typer.Option("--store", help="Write the new variant here (default: the same store).")]
Workers = Annotated[
    int | None, typer.Option("--workers", min=1, help="Units converted side by side (default: up to 4).")
]
Codec = Annotated[str | None, typer.Option("--codec", help="Compression of the new variant (default: the source's).")]
AllowUnhealthy = Annotated[bool, typer.Option("--allow-unhealthy", help="Store NaN/Inf/all-zero states anyway.")]
NewLabel = Annotated[str | None, typer.Option("--label", help="Name the new variant: select it as STORE#LABEL.")]
AnotherModel = Annotated[
    bool, typer.Option("--another-model", help="Let this model into a --store that holds another model's states.")
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="Print nothing while the conversion runs (no progress, no phase lines: a long conversion is silent for minutes); errors and the final summary still print.",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")]


@app.command()
def convert(
    target: ConvertSource,
    precision: Precision,
    store: IntoStore = None,
    workers: Workers = None,
    codec: Codec = None,
    allow_unhealthy: AllowUnhealthy = False,
    label: NewLabel = None,
    another_model: AnotherModel = False,
    quiet: Quiet = False,
    json_out: JsonOut = False,
) -> None:
    """Derive an FP8 variant from a stored one, streaming and resumable, with its storage error measured.

    Example: hsstore convert 'out/tiny.zarr#dtype=bf16' --precision fp8-e4m3
    """
    from hsstore.storage.convert import convert as run_convert

    with _progress_bar(hidden=quiet or json_out) as bar:
        task = bar.add_task("convert", total=None)
        r = run_convert(
            target,
            precision,
            store,
            workers,
            allow_unhealthy,
            on_progress=lambda done, total: bar.update(task, completed=done, total=total),
            codec=codec,
            label=label,
            another_model=another_model,
        )
    emit(r, json_out, convert_text)
    if not r.complete:
        raise typer.Exit(1)


def _progress_bar(hidden: bool) -> Progress:
    """The conversion's progress bar, on a terminal's stderr only (stdout holds the report alone), and not
    when ``hidden`` (--quiet, --json)."""
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    return Progress(
        TextColumn("convert"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} samples"),
        transient=True,
        disable=hidden or not sys.stderr.isatty(),
        console=Console(stderr=True),
    )

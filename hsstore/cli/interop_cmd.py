"""`hsstore import`, `export` and `vocab-map`: other tools' caches in and out, and draft vocabularies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hsstore.cli.app import AnotherModel, app, emit

if TYPE_CHECKING:
    from hsstore.core.schema.reports import AuditSummary, ExportReport, ImportReport, VocabMapReport

FORMATS_HELP = "specforge | modelopt | speculators | eagle"


def _ints(text: str | None, what: str) -> list[int] | None:
    from hsstore.core.errors import BadInput

    if text is None:
        return None
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise BadInput(f"{what} {text!r} is not a comma-separated list of stored layer ids, e.g. 1,2") from None


# `hsstore import`'s arguments and options, one alias each
Format = Annotated[str, typer.Argument(help=f"The cache's format: {FORMATS_HELP}.")]
Source = Annotated[str, typer.Argument(help="The cache folder the tool wrote.")]
IntoStore = Annotated[str, typer.Option("--store", help="The hsstore store to import into (created if new).")]
Layers = Annotated[
    str | None,
    typer.Option(
        "--layers",
        help="Layer id of each state slot in the files, aux slots in file order then the target, "
        "e.g. 2,16,29,final_norm (not needed for an `hsstore export` folder).",
    ),
]
Capture = Annotated[
    str | None,
    typer.Option(
        "--capture",
        help="What an id means: output (output of layer i: SGLang, HF hidden_states[i+1]), input "
        "(state entering layer i = output of i-1: vLLM) or unknown (find it with diff --align).",
    ),
]
Tokenizer = Annotated[str | None, typer.Option("--tokenizer", help="The target's tokenizer folder (default: --model).")]
Model = Annotated[
    str | None,
    typer.Option(
        "--model", help="The target model's folder: config (layers, width) and, if present, weights identity."
    ),
]
NumLayers = Annotated[
    int | None, typer.Option("--num-layers", min=1, help="Decoder layers of the target (without --model).")
]
ImportJobs = Annotated[
    int | None, typer.Option("--jobs", min=1, help="Files read in parallel (default: cores, max 8).")
]
Codec = Annotated[str | None, typer.Option("--codec", help="Compression of the imported states.")]
SkipBad = Annotated[
    bool, typer.Option("--skip-bad", help="Skip unreadable or foreign files (counted) instead of stopping.")
]
AllowUnhealthy = Annotated[bool, typer.Option("--allow-unhealthy", help="Store NaN/Inf or all-zero states anyway.")]
ImportLimit = Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N files.")]
Audit = Annotated[
    int | None,
    typer.Option(
        "--audit",
        min=1,
        help="When the import finishes, audit N samples against --model (as hsstore check does) and record the result for hsstore info.",
    ),
]
Label = Annotated[str | None, typer.Option("--label", help="Name the imported variant: select it as STORE#LABEL.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="Print nothing while the import runs (no progress, no phase lines: a long import is silent for minutes); errors and the final summary still print.",
    ),
]


@app.command("import")
def import_(
    format: Format,
    source: Source,
    store: IntoStore,
    layers: Layers = None,
    capture: Capture = None,
    tokenizer: Tokenizer = None,
    model: Model = None,
    num_layers: NumLayers = None,
    jobs: ImportJobs = None,
    codec: Codec = None,
    skip_bad: SkipBad = False,
    allow_unhealthy: AllowUnhealthy = False,
    limit: ImportLimit = None,
    audit: Audit = None,
    label: Label = None,
    another_model: AnotherModel = False,
    json_out: JsonOut = False,
    quiet: Quiet = False,
) -> None:
    """Import another tool's hidden-state cache as a variant, keyed by hsstore's content keys.

    Example: hsstore import speculators ./data --tokenizer ./Qwen3-8B --layers 2,18,33,36 --capture input --store s.zarr

    Example: hsstore import eagle ./ge_data --model ./Qwen3-8B --layers final_norm --capture output --store s.zarr --audit 64
    """
    from hsstore.interop.importer import ImportRequest, import_cache
    from hsstore.storage.names import another_model_allowed

    _check_request(label, audit is not None and model is None)
    request = ImportRequest(
        format,
        source,
        store,
        tokenizer,
        model,
        num_layers,
        layers,
        capture,
        codec=codec,
        skip_bad=skip_bad,
        allow_unhealthy=allow_unhealthy,
        limit=limit,
        quiet=quiet or json_out,
        label=label,
        **({} if jobs is None else {"jobs": jobs}),
    )
    with another_model_allowed("import" if another_model else None):  # else refused before a state is written
        report = import_cache(request)
    _audit_and_emit(_label_imported(store, report, label), store, model, audit, json_out)


def _check_request(label: str | None, audit_without_model: bool) -> None:
    """Before the import: BadInput for --audit without --model, or a ``label`` that is not a label (whether
    another variant holds it is checked once the import knows its variant, before it writes a sample)."""
    from hsstore.core.errors import BadInput
    from hsstore.storage.names import check_label

    if audit_without_model:
        raise BadInput(
            "--audit N recomputes samples with the model: pass --model DIR (the target's folder with weights)"
        )
    if label is not None:
        check_label(label)


def _label_imported(store: str, report: ImportReport, label: str | None) -> ImportReport:
    """Give the imported variant its --label (the report says so). A variant that already holds another
    label (an import of hsstore's own export restores its provenance: it is the variant exported) keeps it."""
    if label is None:
        return report
    import sys

    from hsstore.storage.store import Store

    s = Store.open(store, mode="a")
    held = s.labels().get(report.variant)
    if held is not None and held != label:
        print(
            f"note: the import is variant {report.variant}, already labelled {held!r}; it keeps that label "
            f"(rename it with: hsstore label '{store}#{held}' {label})",
            file=sys.stderr,
        )
        return report.replace(label=held)
    s.set_label(report.variant, label, by="import")
    return report.replace(label=label)


def _audit_and_emit(report: ImportReport, store: str, model: str | None, audit: int | None, json_out: bool) -> None:
    """Print the import's report; with ``--audit N``, audit N samples of the imported variant against ``model``
    first (the result recorded in the store and the report) and fail (exit 1) when the audit found defects."""
    from hsstore.core.errors import CheckFailed

    found = _audit(str(model), store, report.variant, audit) if audit is not None else None
    if found is not None:
        report = report.replace(audit=found)
    emit(report, json_out, _import_text)
    if found is not None and found.verdict_kind not in ("identical", "within_noise"):
        raise CheckFailed(
            f"imported, but the audit found defects: {found.verdict} (hsstore check "
            f"{model} '{store}#{report.variant}' names them)"
        )


def _audit(model: str, store: str, vid: str, n: int) -> AuditSummary:
    """Audit ``n`` samples of the imported variant against ``model`` and record the result in the store."""
    from hsstore.compare.audit import AuditRequest, run_audit
    from hsstore.storage.info import record_audit
    from hsstore.storage.store import Store

    report = run_audit(AuditRequest(model=model, target=f"{store}#{vid}", samples=n))
    return record_audit(Store.open(store, mode="a"), vid, report)


@app.command("export")
def export(
    target: Annotated[str, typer.Argument(help="STORE#SELECTOR of the variant to export.")],
    format: Annotated[str, typer.Argument(help=f"The tool's format: {FORMATS_HELP}.")],
    dest: Annotated[str, typer.Argument(help="A new or empty folder (or an earlier export of the same variant).")],
    aux: Annotated[
        str | None, typer.Option("--aux", help="Stored layers for the aux slots, in order (default: the aux role).")
    ] = None,
    target_layer: Annotated[
        int | None, typer.Option("--target", help="Stored layer for the target slot (default: the target role).")
    ] = None,
    compress: Annotated[bool, typer.Option("--compress", help="specforge: write .ckpt.gz files.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="Samples written in parallel.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N samples.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Write a variant as another tool's cache, read unchanged by that tool's own loader.

    Example: hsstore export 's.zarr#dtype=bf16' speculators ./spec-data
    """
    from hsstore.interop.exporter import ExportRequest, export_cache

    kw = {} if jobs is None else {"jobs": jobs}
    report = export_cache(
        ExportRequest(target, format, dest, _ints(aux, "--aux"), target_layer, compress, limit=limit, **kw)
    )
    emit(report, json_out, _export_text)


@app.command("vocab-map")
def vocab_map(
    target: Annotated[str, typer.Argument(help="STORE#SELECTOR of the variant whose loss-masked tokens to count.")],
    size: Annotated[int, typer.Option("--size", help="Draft vocabulary size, e.g. 32000.")],
    out: Annotated[str | None, typer.Option("--out", help="Output folder (default: vocab-map-VARIANT-SIZE).")] = None,
    target_vocab_size: Annotated[
        int | None,
        typer.Option(
            "--target-vocab-size",
            min=1,
            help="The target model's vocabulary (default: its config, else the tokenizer's).",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """EAGLE-3 draft vocabulary (d2t/t2d) from a variant's loss-masked token frequencies.

    Writes d2t-N.npy and t2d-N.npy (speculators), vocab_mapping-N.pt (SpecForge, EAGLE-3), token_freq.pt
    and vocab-map-N.json (store, variant, tokenizer fingerprint, coverage).

    Example: hsstore vocab-map 's.zarr#dtype=bf16' --size 32000 --out ./vocab
    """
    from hsstore.interop.vocab import write_vocab_map
    from hsstore.storage.store import Store, split_target

    if out is None:
        path, sel = split_target(target)
        s = Store.open(path)
        out = f"vocab-map-{s.select(sel)}-{size}"
    emit(write_vocab_map(target, size, out, target_vocab_size).replace(out=out), json_out, _vocab_text)


def _vocab_text(r: VocabMapReport) -> str:
    return (
        f"draft vocabulary of {r.draft_vocab_size} tokens from {r.samples} samples ({r.loss_tokens} loss-masked "
        f"tokens, {r.distinct_tokens} distinct): covers {r.coverage:.2%} of them\n"
        f"target vocabulary {r.target_vocab_size} (from {r.target_vocab_from}); wrote "
        + ", ".join(sorted(r.files))
        + f" to {r.out}"
    )


def _import_text(r: ImportReport) -> str:
    src = r.stated
    lines = [
        f"imported {r.samples} samples of {r.format} cache {r.source} into {r.store}#{r.variant}: "
        f"{r.samples_written} written, {r.samples_present} already there, {r.duplicates} duplicate(s)"
        f" ({r.tokens_written:,} tokens, {r.seconds:.1f}s)",
        f"  layers {src.layers} stated by {src.stated_by} under --capture {src.capture} -> hsstore "
        f"aux={r.layers['aux']} target={r.layers['target']} (recipe.capture={r.capture})",
    ]
    if r.provenance == "restored":
        lines.append(
            "  provenance restored from hsstore's export record (sealed, files matching): require= the "
            "exported variant opens this one"
        )
    elif r.provenance_note:
        lines.append(f"  {r.provenance_note}; fields the files do not record are 'unknown'")
    if r.capture == "unknown":
        lines.append(
            "  capture convention unknown: find each layer's match with `hsstore diff IMPORTED NATIVE --align`"
        )
    from msgspec import UnsetType

    if not isinstance(r.audit, UnsetType):
        a = r.audit
        lines.append(f"  audit of {a.samples} samples against {a.model}: {a.verdict}; {a.bound}")
    if r.missing_states:
        lines.append(f"  {r.missing_states} row(s) have no hidden-states file (not imported)")
    if r.skipped_bad:
        lines.append(f"  {r.skipped_bad} file(s) skipped (--skip-bad); first: {r.bad[0].why}")
    return "\n".join(lines)


def _export_text(r: ExportReport) -> str:
    return (
        f"exported {r.samples} samples ({r.tokens:,} tokens) of {r.store}#{r.variant} as {r.format} "
        f"to {r.dest} in {r.seconds:.1f}s\n"
        f"  slots: aux={r.slots['aux']} target={r.slots['target']} (hsstore ids) = {r.tool_layers} in "
        f"{r.format}'s numbering ({r.tool_capture})\n"
        f"  record: {r.record}; read with {r.loader}"
    )

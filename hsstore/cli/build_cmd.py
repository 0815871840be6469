"""`hsstore build` and `hsstore env`: building variants and probing this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hsstore.cli.app import AnotherModel, app, emit
from hsstore.core.schema.build import BuildResult, InputCounts
from hsstore.core.schema.record import or_none

if TYPE_CHECKING:
    from hsstore.core.schema.manifest import Manifest
    from hsstore.core.schema.reports import EnvReport


# `hsstore build`'s arguments and options, one alias each
ManifestPath = Annotated[str, typer.Argument(help="Build manifest (TOML), e.g. manifests/tiny.toml.")]
StorePath = Annotated[str | None, typer.Option("--store", help="Store path or URL (overrides [store] path).")]
Backends = Annotated[list[str] | None, typer.Option("--backend", help="torch | fla (repeatable).")]
Dtypes = Annotated[list[str] | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 (repeatable).")]
Devices = Annotated[list[str] | None, typer.Option("--device", help="cpu | cuda | cuda:N (repeatable).")]
GpusPerRank = Annotated[
    int | None,
    typer.Option("--gpus-per-rank", help="Spread the model over this many GPUs per rank (needs accelerate)."),
]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="Use only the first N usable samples.")]
Codec = Annotated[
    str | None, typer.Option("--codec", help="none | zstd | shuffle-zstd (default) | blosc-lz4 | blosc-zstd.")
]
Precision = Annotated[
    str | None,
    typer.Option("--precision", help="Store quantized: fp8-e4m3 (default: as computed; overrides [store] precision)."),
]
AllowUnhealthy = Annotated[bool, typer.Option("--allow-unhealthy", help="Store NaN/Inf/all-zero states.")]
NoSpaceCheck = Annotated[
    bool,
    typer.Option("--no-space-check", help="Start even if the estimate exceeds the free space of a local store's disk."),
]
Label = Annotated[
    str | None, typer.Option("--label", help="Name the variant (a build of one variant): select it as STORE#LABEL.")
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="Print nothing while the build runs (no progress, no phase lines: a long build is silent for minutes); errors and the final summary still print.",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
# the [generate] table's keys, each of which turns regeneration of the replies on
Engine = Annotated[
    str | None,
    typer.Option(
        "--engine", help="Regenerate the replies first: model (in process) | openai (with --url); [generate] engine."
    ),
]
Url = Annotated[str | None, typer.Option("--url", help="The OpenAI-compatible server ([generate] url).")]
Turns = Annotated[str | None, typer.Option("--turns", help="last | all ([generate] turns).")]
MaxNewTokens = Annotated[int | None, typer.Option("--max-new-tokens", help="[generate] max_new_tokens.")]
Temperature = Annotated[float | None, typer.Option("--temperature", help="0 = greedy ([generate] temperature).")]
GenSeed = Annotated[int | None, typer.Option("--gen-seed", help="[generate] seed.")]
Reasoning = Annotated[str | None, typer.Option("--reasoning", help="keep | drop ([generate] reasoning).")]


@app.command()
def build(
    manifest: ManifestPath,
    store: StorePath = None,
    backend: Backends = None,
    dtype: Dtypes = None,
    device: Devices = None,
    gpus_per_rank: GpusPerRank = None,
    limit: Limit = None,
    codec: Codec = None,
    precision: Precision = None,
    allow_unhealthy: AllowUnhealthy = False,
    no_space_check: NoSpaceCheck = False,
    label: Label = None,
    another_model: AnotherModel = False,
    quiet: Quiet = False,
    json_out: JsonOut = False,
    engine: Engine = None,
    url: Url = None,
    turns: Turns = None,
    max_new_tokens: MaxNewTokens = None,
    temperature: Temperature = None,
    gen_seed: GenSeed = None,
    reasoning: Reasoning = None,
) -> None:
    """Run the model once per backend x dtype x device and write one variant each.

    Idempotent: samples already committed are skipped, so re-running after a crash resumes.

    Example: hsstore build manifests/tiny.toml --dtype bf16 --dtype fp32
    """
    from hsstore.capture.run.driver import build as run_build

    m = _manifest(
        manifest, store, backend, dtype, device, gpus_per_rank, codec, precision, allow_unhealthy, label, another_model
    )
    m = _regenerating(m, engine, url, turns, max_new_tokens, temperature, gen_seed, reasoning)
    summary = run_build(m, limit=limit, quiet=quiet, space_check=not no_space_check)
    if summary.rows_report is not None and json_out:  # on stderr, so --json output stays one document
        typer.echo(_rows_line(summary), err=True)
    emit(summary, json_out, lambda s: "\n".join(_lines(s)))


def _manifest(
    path: str,
    store: str | None,
    backends: list[str] | None,
    dtypes: list[str] | None,
    devices: list[str] | None,
    gpus_per_rank: int | None,
    codec: str | None,
    precision: str | None,
    allow_unhealthy: bool,
    label: str | None,
    another_model: bool,
) -> Manifest:
    """The build manifest at ``path`` with the options given over its keys (None, [] or False: not given)."""
    from hsstore.capture.inputs.manifest_file import load_manifest
    from hsstore.core.outputs import expand_user

    return load_manifest(path).with_overrides(
        store_path=expand_user(store) if store else store,
        backends=backends,
        dtypes=dtypes,
        devices=devices,
        codec=codec,
        gpus_per_rank=gpus_per_rank,
        allow_unhealthy=allow_unhealthy or None,
        precision=precision,
        label=label,
        another_model=another_model or None,
    )


def _regenerating(
    m: Manifest,
    engine: str | None,
    url: str | None,
    turns: str | None,
    max_new_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    reasoning: str | None,
) -> Manifest:
    """``m`` with the options given over its ``[generate]`` keys (None: not given); any one turns regeneration on."""
    return m.with_generate(
        engine=engine,
        url=url,
        turns=turns,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        reasoning=reasoning,
    )


def _rows_line(summary: BuildResult) -> str:
    inp = summary.inputs
    n = sum(inp.rejected.values()) + inp.duplicates + inp.truncated
    return (
        f"inputs: {n} row(s) not taken as they were ({sum(inp.rejected.values())} rejected, {inp.duplicates} "
        f"duplicate, {inp.truncated} truncated{dropped_note(summary.inputs)}), each named in {summary.rows_report}"
    )


def dropped_note(inputs: InputCounts) -> str:
    """How many trained replies truncation cut off whole (the rows lose them; raise max_length to keep them)."""
    n = or_none(inputs.replies_dropped) or 0
    return f" ({n} repl{'y' if n == 1 else 'ies'} dropped whole: raise [data] max_length to keep them)" if n else ""


def _lines(summary: BuildResult) -> list[str]:
    """The text summary of a build."""
    lines = [f"store {summary.store}  (rank {summary.rank}/{summary.world_size})"]
    inp = summary.inputs
    rej = ", ".join(f"{k}: {v}" for k, v in inp.rejected.items()) or "none"
    lines.append(
        f"inputs: {inp.rows} rows, {inp.usable} usable, {inp.truncated} truncated{dropped_note(summary.inputs)}, "
        f"{inp.duplicates} duplicate; rejected: {rej}"
    )
    if summary.rows_report is not None:
        lines.append(f"  rows not taken as they were, each with its reason: {summary.rows_report}")
    for r in summary.variants:
        what = (
            "nothing new (all present)"
            if r.samples_written == r.samples_by_others == 0
            else f"{r.samples_written} samples written"
        )
        if r.samples_by_others:  # computed here, committed first by a concurrent build
            what += f", {r.samples_by_others} committed meanwhile by another writer"
        k = r.kernels
        lines.append(
            f"variant {r.variant} {r.backend}/{r.dtype}/{r.device}: {what}, {r.samples_present} "
            f"already present; {r.tokens:,} tokens computed, {r.bytes / 1e6:.1f} MB written, {r.seconds:.1f}s; kernels: "
            f"gated-delta={k.chunk_gated_delta_rule} conv1d={k.causal_conv1d} attention={k.attention}"
        )
    for vid, n in sorted((summary.samples_not_in_inputs or {}).items()):
        if n:  # a variant keeps every sample committed to it: say so where a user fixed or removed rows
            lines.append(
                f"  variant {vid} also holds {n:,} committed sample(s) not among these inputs (an earlier "
                "build's: other rows, a larger --limit, or rows changed since), and readers read them too; "
                "build into a new store to hold only these"
            )
    if summary.replies_generated is not None:  # [generate]
        lines.append(
            f"replies: {summary.replies_generated} generated, {summary.replies_reused} reused from an earlier "
            f"build's checkpoints; ledger: {summary.ledger}"
        )
    lines.append(f"build {summary.build_id} recorded in {summary.build_record}")
    lines.append(f"done in {summary.seconds:.1f}s")
    return lines


@app.command()
def env(
    model: Annotated[str | None, typer.Option("--model", help="Model dir or builtin:NAME to probe.")] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="Probe as this backend would run (torch | fla).")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="Device to probe on.")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """This machine's environment fingerprint; with --model, the kernel each family would use.

    Example: hsstore env --model builtin:tiny-qwen3_5 --backend torch
    """
    from hsstore.capture.model.environment import probe

    emit(probe(model, backend, device), json_out, _env_text)


def _env_text(r: EnvReport) -> str:
    """One line per scalar field, then each table's entries indented under its name."""
    fields = r.to_dict()
    lines = [f"{k}: {v}" for k, v in fields.items() if not isinstance(v, dict)]
    for k, v in fields.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {vv}" for kk, vv in v.items()]
    return "\n".join(lines)

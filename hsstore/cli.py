"""The ``hsstore`` command line: parses arguments and calls the library, nothing more."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer

from .errors import CheckFailed, HsstoreError

app = typer.Typer(
    help="Cached hidden states for speculative-decoding drafters, with provenance you can check.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
_state = {"debug": False}


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    _state["debug"] = debug


def _emit(obj: object, json_out: bool, text: str) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str) if json_out else text)


@app.command()
def build(
    manifest: Annotated[str, typer.Argument(help="Build manifest (TOML), e.g. manifests/tiny.toml.")],
    store: Annotated[Optional[str], typer.Option("--store", help="Store path or URL (overrides [store] path).")] = None,
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="torch | fla (repeatable).")] = None,
    dtype: Annotated[Optional[list[str]], typer.Option("--dtype", help="bf16 | fp16 | fp32 (repeatable).")] = None,
    device: Annotated[Optional[list[str]], typer.Option("--device", help="cpu | cuda | cuda:N (repeatable).")] = None,
    gpus_per_rank: Annotated[Optional[int], typer.Option(
        "--gpus-per-rank", help="Spread the model over this many GPUs per rank (needs accelerate).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use only the first N usable samples.")] = None,
    codec: Annotated[Optional[str], typer.Option("--codec", help="none | zstd | shuffle-zstd (default) | blosc-lz4 | blosc-zstd.")] = None,
    allow_unhealthy: Annotated[bool, typer.Option("--allow-unhealthy", help="Store NaN/Inf/all-zero states.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Run the model once per backend x dtype x device and write one variant each.

    Idempotent: samples already committed are skipped, so re-running after a crash resumes.

    Example: hsstore build manifests/tiny.toml --dtype bf16 --dtype fp32
    """
    from .build import build as run_build
    from .manifest import load_manifest

    m = load_manifest(manifest).with_overrides(
        store_path=store, backends=backend, dtypes=dtype, devices=device, codec=codec, gpus_per_rank=gpus_per_rank,
        allow_unhealthy=allow_unhealthy or None,
    )
    summary = run_build(m, limit=limit, quiet=quiet)
    lines = [f"store {summary['store']}  (rank {summary['rank']}/{summary['world_size']})"]
    inp = summary["inputs"]
    rej = ", ".join(f"{k}: {v}" for k, v in inp["rejected"].items()) or "none"
    lines.append(f"inputs: {inp['rows']} rows, {inp['usable']} usable, {inp['truncated']} truncated, "
                 f"{inp['duplicates']} duplicate; rejected: {rej}")
    for r in summary["variants"]:
        what = "nothing new (all present)" if r["samples_written"] == 0 else f"{r['samples_written']} samples written"
        k = r["kernels"]
        lines.append(
            f"variant {r['variant']} {r['backend']}/{r['dtype']}/{r['device']}: {what}, {r['samples_present']} "
            f"already present; {r['tokens']:,} tokens, {r['bytes'] / 1e6:.1f} MB, {r['seconds']:.1f}s; kernels: "
            f"gated-delta={k['chunk_gated_delta_rule']} conv1d={k['causal_conv1d']} attention={k['attention']}"
        )
    lines.append(f"done in {summary['seconds']:.1f}s")
    _emit(summary, json_out, "\n".join(lines))


@app.command()
def info(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Variants with provenance, samples, tokens, bytes, compression and per-layer health.

    Example: hsstore info out/tiny.zarr --json
    """
    from .report import info_text
    from .store import Store, info_dict, split_target

    d = info_dict(Store.open(split_target(store)[0]))
    _emit(d, json_out, info_text(d))


@app.command()
def verify(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Check every checksum, sample, token key and layer; name each bad sample (exit 1 if any).

    Example: hsstore verify out/tiny.zarr
    """
    from .store import Store, split_target
    from .verify import verify as run_verify

    result = run_verify(Store.open(split_target(store)[0]))
    lines = [f"{'OK' if result['ok'] else 'FAILED'}: {result['samples_checked']} samples checked, "
             f"{len(result['problems'])} problem(s)"]
    lines += [f"  {p['variant'] or '-'} {p['key'] or '-'}: {p['what']}" for p in result["problems"]]
    lines += [f"  note: {n}" for n in result["notes"]]
    _emit(result, json_out, "\n".join(lines))
    if not result["ok"]:
        raise typer.Exit(1)


@app.command()
def gc(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    grace: Annotated[float, typer.Option("--grace", help="Seconds before another host's uncommitted unit is debris.")] = 3600.0,
    force: Annotated[bool, typer.Option("--force", help="Remove every uncommitted unit (no writer may be running).")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Remove uncommitted debris of crashed writers; committed data is never touched.

    Example: hsstore gc out/tiny.zarr
    """
    from .gc import collect_garbage
    from .store import Store, split_target

    r = collect_garbage(Store.open(split_target(store)[0], mode="a"), grace, force)
    _emit(r, json_out, f"removed {len(r['removed_units'])} uncommitted unit(s) ({r['removed_files']} files); "
                       f"kept {len(r['kept_in_progress'])} that may still be in progress")


@app.command()
def env(
    model: Annotated[Optional[str], typer.Option("--model", help="Model dir or builtin:NAME to probe.")] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", help="Probe as this backend would run (torch | fla).")] = None,
    device: Annotated[str, typer.Option("--device", help="Device to probe on.")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """This machine's environment fingerprint; with --model, the kernel each family would use.

    Example: hsstore env --model builtin:tiny-qwen3_5 --backend torch
    """
    from .probe import probe

    r = probe(model, backend, device)
    lines = [f"{k}: {v}" for k, v in r.items() if not isinstance(v, dict)]
    for k, v in r.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {vv}" for kk, vv in v.items()]
    _emit(r, json_out, "\n".join(lines))


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="STORE#SELECTOR of the first variant.")],
    b: Annotated[str, typer.Argument(help="STORE#SELECTOR of the second variant.")],
    floor: Annotated[Optional[str], typer.Option("--floor", help="STORE#SELECTOR of a precision floor (e.g. fp32).")] = None,
    layers: Annotated[Optional[list[int]], typer.Option("--layers", help="Only these layers (repeatable).")] = None,
    loss_only: Annotated[bool, typer.Option("--loss-only", help="Only loss-masked tokens.")] = False,
    json_path: Annotated[Optional[str], typer.Option("--json", help="Write the JSON report here ('-' = stdout).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG plot here.")] = None,
    max_rel: Annotated[Optional[float], typer.Option("--max-rel", help="Exit 1 if any layer's rel-L2 exceeds this.")] = None,
    noise: Annotated[float, typer.Option("--noise", help="Divergence up to this multiple of the floor is noise.")] = 2.0,
    device: Annotated[str, typer.Option("--device", help="Where to do the arithmetic (cpu | cuda).")] = "cpu",
) -> None:
    """Per-layer divergence of two variants over all shared samples, with a verdict against a floor.

    Example: hsstore diff 'out/tiny.zarr#dtype=bf16' 'out/tiny.zarr#dtype=fp32'
    """
    from .diff import diff_targets
    from .report import diff_text

    report = diff_targets(a, b, floor, layers or None, loss_only, noise, device)
    if json_path == "-":
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        typer.echo(diff_text(report))
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=2, sort_keys=True)
    if plot:
        from .plot import plot_diff

        plot_diff(report, plot)
    if max_rel is not None:
        worst = max(layer["rel_l2"] for layer in report["layers"])
        if worst > max_rel:
            raise CheckFailed(f"rel-L2 {worst:.3g} exceeds --max-rel {max_rel:g}")


def main() -> None:
    """Entry point: errors become one line on stderr and an exit code (2 bad input, 1 failed check)."""
    try:
        rc = app(standalone_mode=False)  # click returns typer.Exit's code here instead of raising
        sys.exit(rc if isinstance(rc, int) else 0)
    except HsstoreError as e:
        if _state["debug"] or os.environ.get("HSSTORE_DEBUG"):
            raise
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as e:  # click (as vendored by typer) usage errors carry their own exit code
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        raise

"""`hsstore info`, `verify` and `gc`: looking after a store."""

from __future__ import annotations

from typing import Annotated

import typer

from hsstore.cli.app import app, emit
from hsstore.storage.layout import UNIT_GRACE_SECONDS


@app.command()
def info(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Variants with provenance, samples, tokens, bytes, compression and per-layer health.

    Example: hsstore info out/tiny.zarr --json
    """
    from hsstore.cli.report import info_text
    from hsstore.storage.info import store_info
    from hsstore.storage.store import Store, split_target

    r = store_info(Store.open(split_target(store)[0]))
    emit(r.to_dict(), json_out, info_text(r))


@app.command()
def verify(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Check every checksum, sample, token key and layer; name each bad sample (exit 1 if any).

    Example: hsstore verify out/tiny.zarr
    """
    from hsstore.cli.report import verify_text
    from hsstore.storage.store import Store, split_target
    from hsstore.storage.verify import verify as run_verify

    r = run_verify(Store.open(split_target(store)[0]))
    emit(r.to_dict(), json_out, verify_text(r))
    if not r.ok:
        raise typer.Exit(1)


@app.command()
def gc(
    store: Annotated[str, typer.Argument(help="Store path or URL.")],
    grace: Annotated[float, typer.Option("--grace", help="Seconds before another host's uncommitted unit is debris.")] = UNIT_GRACE_SECONDS,
    force: Annotated[bool, typer.Option("--force", help="Remove every uncommitted unit whose writer does not hold it (local stores: running writers keep theirs; object stores: only when no writer runs).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Stable JSON for scripts.")] = False,
) -> None:
    """Remove uncommitted debris of crashed writers; committed data is never touched, symlinks are never
    followed.

    Example: hsstore gc out/tiny.zarr --dry-run
    """
    from hsstore.cli.report import gc_text
    from hsstore.storage.gc import collect_garbage
    from hsstore.storage.store import Store, split_target

    r = collect_garbage(Store.open(split_target(store)[0], mode="a"), grace, force, dry_run)
    emit(r.to_dict(), json_out, gc_text(r))

"""`hsstore info`, `verify` and `gc`: looking after a store."""

from __future__ import annotations

from typing import Annotated

import typer

from hsstore.cli.app import app, emit
from hsstore.storage.layout import UNIT_GRACE_SECONDS


def _whole_store(target: str, command: str) -> str:
    """The store path of ``target``; BadInput if it names a variant (these commands read a whole store, and a
    selector dropped in silence would hide a typo in it)."""
    from hsstore.core.errors import BadInput
    from hsstore.storage.store import split_target

    path, selector = split_target(target)
    if selector is not None:
        raise BadInput(f"hsstore {command} reads a whole store, not one variant: pass {path!r} without "
                       f"'#{selector}'")
    return path


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
    from hsstore.storage.store import Store

    r = store_info(Store.open(_whole_store(store, "info")))
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
    from hsstore.storage.store import Store
    from hsstore.storage.verify import verify as run_verify

    r = run_verify(Store.open(_whole_store(store, "verify")))
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
    from hsstore.storage.store import Store

    r = collect_garbage(Store.open(_whole_store(store, "gc"), mode="a"), grace, force, dry_run)
    emit(r.to_dict(), json_out, gc_text(r))


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
    from hsstore.core.distinguish import label_selector
    from hsstore.storage.names import check_label
    from hsstore.storage.store import Store, split_target

    path, selector = split_target(target)
    check_label(new_label)
    store = Store.open(path, mode="a")
    vid = store.select(selector)
    previous = store.set_label(vid, new_label, by="label")
    said = "unchanged" if previous == new_label else f"was {previous!r}" if previous else "was unlabelled"
    emit({"store": path, "variant": vid, "label": new_label, "previous": previous}, json_out,
         f"variant {vid} labelled {new_label!r} ({said}); select it as {path}#{label_selector(new_label)}")

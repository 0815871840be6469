"""``hsstore export``: one variant -> another tool's cache layout, read unchanged by that tool's loader.

Files are written atomically (temporary name, then rename), ``jobs`` samples at a time. The folder gets
an export record (``hsstore-export.json``; beside the folder for EAGLE, whose loader opens every file in
it) with the variant's provenance and each slot's layer in hsstore's and in the tool's numbering, so
``hsstore import`` of the folder restores the statement without the user repeating it. The record says
``complete: false`` until every file is written. Re-running an export into the folder of an earlier
export of the variant (with any options) makes the folder exactly this export: files named as the
layout's writer names them that this export did not write (an earlier export's samples, layers,
compression) are removed before the record says complete, so a folder never mixes two exports; other
files (a user's) are left alone.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hsstore.core.errors import BadInput, BuildInterrupted
from hsstore.core.interrupt import Stopped, stop_on_signals
from hsstore.core.layer_numbering import TOOL_CAPTURE, Capture, check_no_leak, from_hsstore
from hsstore.core.schema.provenance import ExportRecord
from hsstore.core.schema.record import UNSET, is_set, or_none
from hsstore.core.schema.reports import ExportReport
from hsstore.interop.formats import get_format
from hsstore.interop.formats.interface import TMP_SUFFIX, Format
from hsstore.interop.imported_provenance import (
    add_hash,
    entry_hash,
    named_files,
    now,
    read_sidecar,
    seal_of,
    write_sidecar,
)
from hsstore.interop.importer import folder_mark, mark_folder
from hsstore.storage.leases import lock_folder_alone
from hsstore.storage.store import check_outside_stores

if TYPE_CHECKING:
    from hsstore.core.schema.store_records import VariantRecord
    from hsstore.storage.reader import VariantReader


@dataclass(frozen=True)
class ExportRequest:
    """What ``hsstore export`` was asked to do (CLI options, 1:1)."""

    target: str  # STORE#SELECTOR
    format: str
    dest: str
    aux: list[int] | None = None  # stored layers for the aux slots, in order (default: the aux role)
    target_layer: int | None = None  # the stored layer for the target slot (default: the target role)
    compress: bool = False
    jobs: int = field(default_factory=lambda: min(8, os.cpu_count() or 1))
    limit: int | None = None


def _slots(fmt: Format, rec: VariantRecord, req: ExportRequest) -> tuple[list[int], int]:
    aux = list(req.aux) if req.aux is not None else list(rec.layers.get("aux", []))
    if not fmt.has_aux:
        aux = []
    targets = [req.target_layer] if req.target_layer is not None else list(rec.layers.get("target", []))
    if len(targets) != 1:
        raise BadInput(
            f"variant {rec.id} has target layers {targets}; {fmt.name} files hold one target state: pass --target LAYER"
        )
    missing = [i for i in [*aux, *targets] if i not in rec.all_layers]
    if missing:
        raise BadInput(f"layer(s) {missing} are not stored in variant {rec.id}; stored: {rec.all_layers}")
    if fmt.has_aux and not aux:
        raise BadInput(f"{fmt.name} files need aux layers and variant {rec.id} has none; pass --aux LAYER,...")
    num_layers = or_none(rec.prov.recipe.model.num_layers)
    if isinstance(num_layers, int) and rec.prov.recipe.capture == "decoder_layer_output":
        check_no_leak(aux, targets, num_layers, "pass --aux and --target layers that do not derive from each other")
    return aux, targets[0]


def _check_dest(fmt: Format, dest: Path, store: str, vid: str, held: bool = True) -> None:
    """An export goes into a new or empty folder, or the folder of an earlier export of the same variant
    (whose files are checked, a walk of the folder, once it is ``held``)."""
    sidecar = fmt.sidecar(dest)
    rec = read_sidecar(sidecar, fmt.name, "choose a new folder (an export folder holds one export)")  # None: no file
    if rec is not None:
        if rec.variant != vid:
            raise BadInput(f"{dest} holds an export of variant {rec.variant}, not {vid}; choose a new folder")
        if held:
            _check_holds_the_export(fmt, dest, sidecar, rec)
        return
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"export folder {str(dest)!r} exists and is not empty; choose a new or empty folder")


def _check_holds_the_export(fmt: Format, dest: Path, sidecar: Path, rec: ExportRecord) -> None:
    """BadInput unless the files of ``dest`` named as an export names its files are the ones the complete
    export ``rec`` left (their number and bytes): a re-export removes such files it does not write, so a
    folder that holds others (the folder was removed and another tool's cache written there — an EAGLE
    record lies beside its folder and outlives it) must not be taken for the export."""
    if not rec.complete:  # a killed export, resumed: its folder must be the one it marked
        if is_set(rec.folder_token) and folder_mark(dest) not in (rec.folder_token, None):
            raise BadInput(
                f"export folder {str(dest)!r} is not the folder the stopped export {str(sidecar)!r} "
                "was writing: it was made anew since (another tool's files?); hsstore does not replace "
                "files it did not write: choose a new folder"
            )
        return
    if not is_set(rec.folder_files):
        return  # a record of an earlier version (counts not recorded)
    files = [p.stat().st_size for p in named_files(fmt, dest)]
    if (len(files), sum(files)) != (rec.folder_files, rec.folder_bytes):
        raise BadInput(
            f"export folder {str(dest)!r} is not the export {str(sidecar)!r} describes: it holds "
            f"{len(files)} file(s) named as {fmt.name} files ({sum(files):,} bytes), the export left "
            f"{rec.folder_files} ({rec.folder_bytes:,} bytes) — another tool's files, or files changed "
            "since; hsstore does not replace files it did not write: choose a new folder"
        )


def _stale_files(fmt: Format, dest: Path, written: dict[str, int]) -> list[Path]:
    """Files under ``dest`` named as an export of the layout names its files (an earlier export's) that this
    export did not write. Anything else (a user's notes, a config.json beside the samples) is left alone."""
    return [p for p in named_files(fmt, dest) if p.relative_to(dest).as_posix() not in written]


def _make_dest(dest: Path) -> None:
    """Create the export folder; BadInput (before anything is written) if it cannot be made or written."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(
            f"cannot create export folder {str(dest)!r}: {e.strerror or e}; choose a writable path"
        ) from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise BadInput(f"export folder {str(dest)!r} is not writable; choose a writable folder")


def _record(
    fmt: Format,
    reader: VariantReader,
    store: str,
    aux: list[int],
    target: int,
    n: int,
    files: int,
    complete: bool,
    written: dict[str, int] | None = None,
    token: str | None = None,
) -> ExportRecord:
    prov = reader.record.provenance
    recipe = reader.record.prov.recipe
    num_layers = or_none(recipe.model.num_layers)
    known = recipe.capture == "decoder_layer_output" and isinstance(num_layers, int)
    capture: Capture = TOOL_CAPTURE[fmt.name] if known else "unknown"
    tool_layers = [from_hsstore(i, capture, num_layers if known else -1) for i in [*aux, target]]
    return ExportRecord(
        kind="hsstore-export",
        complete=complete,
        format=fmt.name,
        store=store,
        variant=reader.id,
        provenance=prov,
        num_layers=num_layers if isinstance(num_layers, int) else -1,
        slots={"aux": aux, "target": [target]},
        tool_layers=tool_layers,
        tool_capture=capture,
        n_samples=n,
        files_fingerprint=f"{files:032x}",
        exported_at=now(),
        folder_files=len(written) if written else UNSET,
        folder_bytes=sum(written.values()) if written else UNSET,
        folder_token=token or UNSET,
    )


def _claims(reader: VariantReader, target: int) -> dict[str, bool]:
    """Whether the target slot is pre-norm, when the provenance says (Model-Optimizer records it)."""
    recipe = reader.record.prov.recipe
    n = recipe.model.num_layers
    if recipe.capture != "decoder_layer_output" or not isinstance(n, int):
        return {}
    return {"prenorm": False} if target == n else ({"prenorm": True} if target == n - 1 else {})


def _write_all(one: Callable[[int], tuple[int, int]], n: int, jobs: int, dest: Path) -> tuple[int, int]:
    """``one(i)`` for every sample index on ``jobs`` threads, at most ``4 * jobs`` ahead; (files
    fingerprint, tokens). A stop signal drops the samples not started and raises BuildInterrupted."""
    files, tokens = 0, 0
    with stop_on_signals(), ThreadPoolExecutor(jobs, thread_name_prefix="hsstore-export") as pool:
        window: deque[Future[tuple[int, int]]] = deque()
        try:
            for i in range(n):
                window.append(pool.submit(one, i))
                while window and (len(window) >= 4 * jobs or i == n - 1):
                    h, k = window.popleft().result()
                    files, tokens = add_hash(files, h), tokens + k
        except Stopped as e:
            pool.shutdown(wait=False, cancel_futures=True)
            raise BuildInterrupted(
                e.signum,
                f"export interrupted by {e}; {str(dest)!r} is not complete (its record says "
                "complete: false, and import refuses it): re-run the same command to finish",
            ) from None
    return files, tokens


def _write_samples(
    fmt: Format, req: ExportRequest, reader: VariantReader, dest: Path, keys: list[str], aux: list[int], target: int
) -> tuple[int, int, dict[str, int]]:
    """The samples ``keys`` written into ``dest`` as ``fmt`` files (``req.jobs`` at a time), then the files the
    format's writer finishes with: (files fingerprint, tokens, bytes of each file written by its relative path)."""
    writer = fmt.writer(dest, req.compress)
    claims = _claims(reader, target)

    def one(i: int) -> tuple[int, int]:
        ref = reader.ref(keys[i])
        ids, mask = reader.read_tokens(ref)
        aux_t = reader.read_stacked(ref, aux) if aux else None
        tgt = reader.read_stacked(ref, [target])[:, 0]
        d = writer.write(
            i,
            ref.key,
            torch.from_numpy(ids.astype("int64")),
            torch.from_numpy(mask.astype("int64")),
            aux_t,
            tgt,
            claims,
        )
        written[d.rel] = d.size
        return entry_hash(d.rel, d.size, d.xxh3), ref.length

    written: dict[str, int] = {}
    files, tokens = _write_all(one, len(keys), max(1, req.jobs), dest)
    for d in writer.finish(len(keys)):
        files = add_hash(files, entry_hash(d.rel, d.size, d.xxh3))
        written[d.rel] = d.size
    return files, tokens, written


def export_cache(req: ExportRequest) -> ExportReport:
    """Write the variant ``req.target`` as ``req.format`` files into ``req.dest``; returns the report."""
    from hsstore.storage.store import Store, split_target

    t0 = time.time()
    fmt = get_format(req.format)
    path, selector = split_target(req.target)
    store = Store.open(path)
    reader = store.reader(store.select(selector))
    reader.check_corrupt_commits()
    aux, target = _slots(fmt, reader.record, req)
    dest = Path(req.dest)
    check_outside_stores(req.dest, "export folder")
    _check_dest(fmt, dest, path, reader.id, held=False)  # (refused before a folder is made; judged whole once held)
    keys = reader.keys[: req.limit] if req.limit is not None else list(reader.keys)
    _make_dest(dest)
    alone = lock_folder_alone(str(dest))  # held until this export returns: two exports never mix one folder
    if alone is None:
        raise BadInput(
            f"export folder {str(dest)!r} is being written by another export (or read by an import) right "
            "now; wait for it to finish, or choose another folder"
        )
    try:
        return _export_held(req, fmt, reader, path, dest, keys, aux, target, t0)
    finally:
        alone.release()


def _export_held(
    req: ExportRequest,
    fmt: Format,
    reader: VariantReader,
    path: str,
    dest: Path,
    keys: list[str],
    aux: list[int],
    target: int,
    t0: float,
) -> ExportReport:
    """The export, once this process holds ``dest``: what the folder holds is judged again here (another
    export may have finished in it since the first look), then written."""
    _check_dest(fmt, dest, path, reader.id)
    for stale in list(dest.rglob(f"*{TMP_SUFFIX}")):  # a killed export's temporary files
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
    token = mark_folder(dest)
    write_sidecar(fmt.sidecar(dest), _record(fmt, reader, path, aux, target, len(keys), 0, complete=False, token=token))
    files, tokens, written = _write_samples(fmt, req, reader, dest, keys, aux, target)
    for stale in _stale_files(fmt, dest, written):
        stale.unlink(missing_ok=True)
    record = _record(fmt, reader, path, aux, target, len(keys), files, complete=True, written=written, token=token)
    record = record.replace(seal=seal_of(record))  # an import restores the provenance only from a record as written
    write_sidecar(fmt.sidecar(dest), record)
    return ExportReport(
        store=path,
        variant=reader.id,
        format=fmt.name,
        dest=str(dest),
        samples=len(keys),
        tokens=tokens,
        slots=record.slots,
        tool_layers=record.tool_layers,
        tool_capture=record.tool_capture,
        record=str(fmt.sidecar(dest)),
        loader=fmt.loader,
        seconds=time.time() - t0,
    )

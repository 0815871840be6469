"""``hsstore import``: another tool's cache -> one variant, keyed by hsstore's content keys. Streaming (files read a
window at a time by ``jobs`` threads, written in units of bounded size), resumable and idempotent: a committed key is
never written again, and each unit's import record maps its files (path, size, mtime, xxh3_128) to their keys, so a
re-run skips imported files unread. Two imports may share a folder."""

from __future__ import annotations

import errno
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from hsstore.core.errors import BadInput, BuildInterrupted
from hsstore.core.interrupt import Stopped, stop_on_signals
from hsstore.core.keys import SampleTokens, sample_key
from hsstore.core.layer_numbering import FINAL_NORM, Capture, parse_capture, parse_layer_list, slot_layers
from hsstore.core.provenance_match import variant_id
from hsstore.core.schema.provenance import UNKNOWN, ExportRecord, ImportSource, Provenance
from hsstore.core.schema.record import or_none
from hsstore.core.schema.reports import BadFile, ImportReport
from hsstore.interop.formats import get_format
from hsstore.interop.formats.interface import Format
from hsstore.interop.imported_provenance import (
    ImportLog,
    model_identity,
    read_sidecar,
    tokenizer_identity,
    variant_provenance,
)
from hsstore.interop.sample import FileDigest, SourceSample, check_vocab
from hsstore.storage.leases import share_folder
from hsstore.storage.stats import merge_health
from hsstore.storage.store import check_store_outside_source

if TYPE_CHECKING:
    import torch

    from hsstore.capture.run.progress import Progress
    from hsstore.storage.store import Store

# a sample as read: the sample, its states per slot and their health stats (importer._Run._read)
_Read: TypeAlias = "tuple[SourceSample, list[torch.Tensor], list[torch.Tensor]]"

UNIT_BYTES = 256 << 20  # states per unit: bounds the memory an import holds (two copies while writing)


@dataclass(frozen=True)
class ImportRequest:
    """What ``hsstore import`` was asked to do (CLI options, 1:1)."""

    format: str
    source: str
    store: str
    tokenizer: str | None = None
    model: str | None = None
    num_layers: int | None = None
    layers: str | None = None
    capture: str | None = None
    jobs: int = field(default_factory=lambda: min(8, os.cpu_count() or 1))
    codec: str | None = None
    unit_tokens: int | None = None
    skip_bad: bool = False
    allow_unhealthy: bool = False
    limit: int | None = None
    quiet: bool = True
    label: str | None = None  # checked free for the variant the import makes before any sample is written


@dataclass
class Statement:
    """The layer ids and convention of the files' slots, and who stated them."""

    layers: list[int | str]
    capture: Capture
    stated_by: Literal["user", "hsstore-export"]
    num_layers: int | None


def _statement(req: ImportRequest, fmt: Format, root: Path, sidecar: ExportRecord | None) -> Statement:
    if sidecar is not None and not sidecar.complete:
        raise BadInput(
            f"{fmt.sidecar(root)} records an export that never finished (complete: false; it was stopped, "
            f"or is still running): its files may be a part of variant {sidecar.variant}, or a mix. Re-run "
            "the same `hsstore export` to finish the folder, then import it"
        )
    if req.layers is not None and req.capture is not None:
        return Statement(parse_layer_list(req.layers), parse_capture(req.capture), "user", req.num_layers)
    if sidecar is not None and req.layers is None and req.capture is None:
        known = (
            sidecar.num_layers if isinstance(sidecar.num_layers, int) and sidecar.num_layers > 0 else None
        )  # -1: none
        return Statement(list(sidecar.tool_layers), sidecar.tool_capture, "hsstore-export", req.num_layers or known)
    missing = "--layers" if req.layers is None else "--capture"
    slots = "aux layers in file order, then the target" if fmt.has_aux else "the one target layer"
    raise BadInput(
        f"{fmt.name} files do not record which layers they hold: pass --layers ({slots}, e.g. "
        f"'2,16,29,{FINAL_NORM}') and --capture output|input|unknown; {missing} is missing"
    )


def _check_claims(stmt: Statement, claims: dict[str, bool], item: str) -> None:
    """Model-Optimizer files may state ``hidden_states_prenorm``: it must agree with the user."""
    if "prenorm" not in claims or stmt.capture == "unknown":
        return
    says_post = stmt.layers[-1] == FINAL_NORM
    if claims["prenorm"] == says_post:
        file_says = "pre-norm" if claims["prenorm"] else "post-norm"
        raise BadInput(
            f"{item} says its target is {file_says} (hidden_states_prenorm={claims['prenorm']}), "
            f"but --layers names the target {stmt.layers[-1]!r}; state the target layer that matches"
        )


def _first_readable(fmt: Format, root: Path, items: list[str], vocab: int, skip_bad: bool) -> tuple[SourceSample, str]:
    """The first file that reads: the probe the others are checked against (--skip-bad: bad ones passed over)."""
    first: BadInput | None = None
    for item in items:
        try:
            s = fmt.read(root, item)
            check_vocab(s, vocab)
            return s, item
        except BadInput as e:
            if not skip_bad:
                raise
            first = first or e
    raise BadInput(f"none of the {len(items)} {fmt.name} files under {str(root)!r} could be imported; first: {first}")


def _recorded_model(record: ExportRecord | None) -> str | None:
    """The model an hsstore export's record names, where its tokenizer loads here (a builtin, or a folder that
    exists): an export imported back needs no --tokenizer."""
    model = record.provenance.get("recipe", {}).get("model", {}) if record is not None else {}
    path = model.get("path") if isinstance(model, dict) else None
    return path if isinstance(path, str) and (path.startswith("builtin:") or os.path.isdir(path)) else None


def _recorded_tokenizer(record: ExportRecord) -> Any:
    tokenizer = record.provenance.get("recipe", {}).get("tokenizer", {})
    return tokenizer.get("fingerprint") if isinstance(tokenizer, dict) else None


def _check_label(location: str, vid: str, label: str) -> None:
    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.names import check_label_free
    from hsstore.storage.store import Store

    try:
        check_label_free(Store.open(location), vid, label)
    except StoreNotFound:
        pass


def _tokenizer(req: ImportRequest, sidecar: ExportRecord | None) -> tuple[dict[str, Any], int]:
    """(identity, vocabulary size) of the tokenizer the samples are keyed with: ``--tokenizer``, else ``--model``'s,
    else that of the model an hsstore export's record names (refused where it is not the one recorded)."""
    recorded = _recorded_model(sidecar) if req.tokenizer is None and req.model is None else None
    tok_path = req.tokenizer or req.model or recorded
    if tok_path is None:
        raise BadInput("pass --tokenizer PATH (the target model's tokenizer folder): sample keys hash its identity")
    tok, vocab = tokenizer_identity(tok_path)
    if recorded is not None and sidecar is not None and tok["fingerprint"] != _recorded_tokenizer(sidecar):
        raise BadInput(
            f"the export names its model {recorded!r}, whose tokenizer here is not the one its samples "
            "were keyed with; pass --tokenizer PATH (the tokenizer the states were made with)"
        )
    return tok, vocab


def _new_variant(
    req: ImportRequest, prov: Provenance, layers: dict[str, list[int]], probe: SourceSample
) -> tuple[Store, str]:
    """The store (created if new) and the variant the import writes, created with the probe's geometry and
    dtype (or the one an earlier run of the same import created: its units are resumed)."""
    from hsstore.storage.codecs import DEFAULT as DEFAULT_CODEC
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.storage.store import Store

    store = Store.create(req.store)
    itemsize = probe.target.element_size()
    vid = store.create_variant(
        prov.to_dict(),
        layers,
        probe.hidden_size,
        probe.dtype,
        req.codec or DEFAULT_CODEC,
        chunk_tokens(probe.hidden_size, itemsize),
    )
    return store, vid


def import_cache(req: ImportRequest) -> ImportReport:
    """Import ``req.source`` into ``req.store``; returns the report ``hsstore import --json`` prints."""
    t0 = time.time()
    fmt, root = get_format(req.format), Path(req.source)
    fmt.check_dir(root)
    check_store_outside_source(req.store, req.source)  # (a store inside the folder would become files of it)
    held = share_folder(str(root))  # an export cannot rewrite the folder while this import reads it
    if held is None:
        raise BadInput(
            f"{str(root)!r} is being written by an `hsstore export` right now; wait for it to finish, "
            "then import the folder"
        )
    try:
        return _import_held(req, fmt, root, t0)
    finally:
        held.release()


def _import_held(req: ImportRequest, fmt: Format, root: Path, t0: float) -> ImportReport:
    """The import, while this process holds ``root`` shared (no export rewrites it meanwhile)."""
    items = fmt.items(root)
    if req.limit is not None:
        items = items[: req.limit]
    if not items:
        raise BadInput(f"no {fmt.name} sample files under {str(root)!r} (expected {fmt.layout})")
    stmt = _statement(req, fmt, root, sidecar := read_sidecar(fmt.sidecar(root), fmt.name))
    tok, vocab = _tokenizer(req, sidecar)
    probe, probe_item = _first_readable(fmt, root, items, vocab, req.skip_bad)
    _check_claims(stmt, probe.claims, probe.name)
    model = model_identity(req.model, stmt.num_layers, probe.hidden_size)
    layers = slot_layers(stmt.layers, probe.n_aux, True, stmt.capture, int(model["num_layers"]))
    source = ImportSource(
        tool=fmt.tool,
        format=fmt.name,
        path=str(root.resolve()),
        layers=stmt.layers,
        capture=stmt.capture,
        stated_by=stmt.stated_by,
        claims=dict(probe.claims),
    )
    record = sidecar if stmt.stated_by == "hsstore-export" else None
    prov, restored, note = variant_provenance(
        fmt, root, record, source, tok, model, req.model is not None, layers, probe, req.jobs
    )
    if req.label is not None:  # before the store is made or a sample written: a re-import keeps its own label
        _check_label(req.store, variant_id(prov.to_dict()), req.label)
    store, vid = _new_variant(req, prov, layers, probe)
    per_token = probe.hidden_size * probe.target.element_size() * (probe.n_aux + 1)  # bytes of states
    unit_tokens = req.unit_tokens or max(1, UNIT_BYTES // per_token)
    run = _Run(req, fmt, root, store, vid, layers, stmt, probe, probe_item, tok["fingerprint"], vocab, unit_tokens)
    counts = run.go(items)
    return ImportReport(
        store=req.store,
        variant=vid,
        format=fmt.name,
        source=str(root),
        layers=layers,
        capture=str(or_none(prov.recipe.capture) or UNKNOWN),
        stated=source,
        seconds=time.time() - t0,
        provenance="restored" if restored else "imported",
        provenance_note=note,
        **counts,
    )


class _Run:
    """One import run: read in parallel, check each sample against the first, write units, log them."""

    def __init__(
        self,
        req: ImportRequest,
        fmt: Format,
        root: Path,
        store: Store,
        vid: str,
        layers: dict[str, list[int]],
        stmt: Statement,
        probe: SourceSample,
        probe_item: str,
        tok_fp: str,
        vocab: int,
        unit_tokens: int,
    ) -> None:
        from hsstore.storage.writer import UnitWriter

        self.req, self.fmt, self.root, self.layers, self.stmt, self.probe = req, fmt, root, layers, stmt, probe
        self.tok_fp, self.vocab, self.unit_tokens = tok_fp, vocab, unit_tokens
        self.probe_item = probe_item
        self.run_id = uuid.uuid4().hex[:12]
        self.writer = UnitWriter(
            store, vid, writer_id=f"imp-{self.run_id}", check_health=not req.allow_unhealthy, command="import"
        )
        self.log = ImportLog(store, vid, fmt, root, self.run_id)
        self.done = set(self.writer.committed_keys())
        self.seen: set[str] = set()
        self.pending: list[tuple[SampleTokens, list[torch.Tensor], list[torch.Tensor]]] = []
        self.pending_tokens = 0
        self.entries: list[tuple[str, str, list[FileDigest]]] = []
        self.counts = {"written": 0, "present": 0, "duplicates": 0, "tokens_written": 0}
        self.bad: list[BadFile] = []

    def go(self, items: list[str]) -> dict[str, Any]:
        """Import ``items``; the report's counts (ImportReport's fields)."""
        from hsstore.capture.run.progress import Progress

        todo, known = self.log.split_known(items, self.done)
        self.counts["present"] += len(known)
        progress = Progress(f"import {self.fmt.name}", len(todo), self.probe.length * len(todo), self.req.quiet)
        try:
            with stop_on_signals():
                self._all(todo, progress)
        except Stopped as e:
            raise BuildInterrupted(
                e.signum,
                f"import interrupted by {e}; {self.counts['written']} samples written by "
                "this run are committed and kept: re-run the same command to finish",
            ) from None
        finally:
            progress.close()
        keys = self.seen | {k for _, k in known}
        self.log.finish(self.fmt.tool, len(items), keys, self.counts, len(self.bad), getattr(self.fmt, "missing", 0))
        return {
            "items": len(items),
            "samples": len(keys),
            "samples_written": self.counts["written"],
            "samples_present": self.counts["present"],
            "duplicates": self.counts["duplicates"],
            "tokens_written": self.counts["tokens_written"],
            "skipped_bad": len(self.bad),
            "bad": self.bad[:20],
            "missing_states": getattr(self.fmt, "missing", 0),
            "run": self.run_id,
        }

    def _all(self, todo: list[str], progress: Progress) -> None:
        """Read, check and write every item of ``todo``, in units."""
        for item, got in self._stream(todo):
            if isinstance(got, BadInput):
                if not self.req.skip_bad:
                    raise got
                self.bad.append(BadFile(item=item, why=str(got)))
                continue
            self._take(item, *got)
            progress.advance(1, got[0].length)
            if self.pending_tokens >= self.unit_tokens:
                self._flush()
        self._flush()

    def _read(self, item: str) -> _Read | BadInput:
        """The sample, its states per slot (contiguous, aux slots then target) and their health stats —
        done here, on the reader threads, so the writing thread only concatenates."""
        from hsstore.storage.stats import stats_tensor

        try:
            s = self.probe if item == self.probe_item else self.fmt.read(self.root, item)
        except BadInput as e:
            return e
        aux = [] if s.aux is None else [s.aux[:, j].contiguous() for j in range(s.n_aux)]
        slots = aux + [s.target]
        return s, slots, [stats_tensor(t, [s.length]) for t in slots]

    def _stream(self, items: list[str]) -> Iterator[tuple[str, _Read | BadInput]]:
        """Samples in item order; up to ``4 * jobs`` files are read ahead, in parallel."""
        jobs = max(1, self.req.jobs)
        with ThreadPoolExecutor(jobs, thread_name_prefix="hsstore-import") as pool:
            window: deque[tuple[str, Future[_Read | BadInput]]] = deque()
            try:
                for item in items:
                    window.append((item, pool.submit(self._read, item)))
                    if len(window) >= 4 * jobs:
                        i, f = window.popleft()
                        yield i, f.result()
                while window:
                    i, f = window.popleft()
                    yield i, f.result()
            except GeneratorExit:  # the consumer stopped (an error, a signal): reads not started are dropped
                pool.shutdown(wait=False, cancel_futures=True)
                raise

    def _check(self, s: SourceSample) -> None:
        p = self.probe
        if (s.hidden_size, s.dtype, s.n_aux) != (p.hidden_size, p.dtype, p.n_aux):
            raise BadInput(
                f"{s.name}: {s.n_aux} aux state(s) of width {s.hidden_size} in {s.dtype}, but {p.name} "
                f"has {p.n_aux} of width {p.hidden_size} in {p.dtype}: the folder mixes two caches"
            )
        if s.claims != p.claims:
            raise BadInput(
                f"{s.name} states {s.claims or 'nothing'} about itself, {p.name} {p.claims or 'nothing'}: "
                "the folder mixes two caches (pre-norm and post-norm targets?)"
            )
        check_vocab(s, self.vocab)

    def _take(self, item: str, s: SourceSample, slots: list[torch.Tensor], health: list[torch.Tensor]) -> None:
        try:
            self._check(s)
        except BadInput as e:
            if not self.req.skip_bad:
                raise
            self.bad.append(BadFile(item=item, why=str(e)))
            return
        key = sample_key(self.tok_fp, s.input_ids, s.loss_mask)
        self.entries.append((item, key, s.files))
        if key in self.seen or key in self.done:
            self.counts["duplicates" if key in self.seen else "present"] += 1
            self.seen.add(key)
            return
        self.seen.add(key)
        self.pending.append((SampleTokens(key, s.input_ids, s.loss_mask), slots, health))
        self.pending_tokens += s.length

    def _flush(self) -> None:
        import torch

        commit = None
        if self.pending:
            samples = [t for t, _, _ in self.pending]
            ids = [*self.layers["aux"], *self.layers["target"]]  # slot j holds layer ids[j]
            states = {layer: torch.cat([p[1][j] for p in self.pending]) for j, layer in enumerate(ids)}
            health = {layer: merge_health([p[2][j] for p in self.pending]) for j, layer in enumerate(ids)}
            commit = self.writer.write(samples, states, health=health)
            wrote = commit.samples if commit is not None else []
            self.counts["written"] += len(wrote)
            self.counts["tokens_written"] += commit.n_tokens if commit is not None else 0
            self.counts["present"] += len(samples) - len(wrote)  # a racing import committed them meanwhile
        if self.entries:
            self.log.chunk(self.entries, None if commit is None else commit.unit)
        self.pending, self.entries, self.pending_tokens = [], [], 0


# --- A mark on an export folder: a random token in an extended attribute of the folder (``user.hsstore.export``)

XATTR = "user.hsstore.export"


def folder_mark(dest: Path) -> str | None:
    """The folder's token; "" if it has none; None where the file system cannot say (no extended attributes)."""
    try:
        return os.getxattr(dest, XATTR).decode("ascii", "replace")
    except OSError as e:
        return "" if e.errno == errno.ENODATA else None


def mark_folder(dest: Path) -> str | None:
    """The folder's token, given a new one if it has none; None where the file system keeps no such marks."""
    token = folder_mark(dest)
    if token:
        return token
    token = uuid.uuid4().hex
    try:
        os.setxattr(dest, XATTR, token.encode())
    except OSError:  # no extended attributes here (or no room for one): the folder goes unmarked
        return None
    return token

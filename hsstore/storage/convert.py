"""``hsstore convert``: derive a variant of another storage precision from a stored one, with no model.

The source is streamed unit by unit, and each source unit becomes one destination unit (same samples,
same order: a dataset over the derived variant sees the same epochs). States are quantized on the CPU
by the function a GPU build uses, so the codes are bit-identical to quantizing at build time; the
storage error against the source is measured per unit and committed with it. Each unit commits
atomically, so a killed convert resumes from its committed units (their samples are skipped), and
units are converted side by side on threads (torch, numpy and the codecs release the GIL).

The derived variant's provenance is the source's plus ``environment.storage`` (precision, scale and
the source it came from; the source is informational: it does not change a number).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

import torch

from hsstore.core.errors import BadInput, BuildInterrupted
from hsstore.core.interrupt import Stopped, stop_on_signals
from hsstore.core.keys import SampleTokens
from hsstore.core.precision_names import SCALE_SCHEME, codec_for_codes, parse_precision
from hsstore.core.provenance_match import numeric_fields, variant_id
from hsstore.core.quant import Quantized, dequantize, error_tensor, from_error_tensor, merge, quantize, summary
from hsstore.core.schema.provenance import Provenance, Storage, StorageSource
from hsstore.core.schema.record import is_set, or_none
from hsstore.core.schema.reports import ConvertReport, FloorMeasure, StorageReport
from hsstore.core.selectors import select
from hsstore.storage import layout
from hsstore.storage.codecs import chunk_tokens, kept_codec_note, parse_codec
from hsstore.storage.fileio import CommitRecord
from hsstore.storage.reader import VariantReader
from hsstore.storage.stats import stats_tensor
from hsstore.storage.store import Store, split_target
from hsstore.storage.writer import UnitWriter

# Store.create_variant's arguments but precision: (provenance, layers, hidden_size, dtype, codec, chunk_tokens)
VariantArgs: TypeAlias = tuple[dict[str, Any], dict[str, list[int]], int, str, str, int]

QUANT_ROWS = 4096  # rows quantized at a time: bounds the float32 temporaries (80 MB at hidden 5120)


def derived_provenance(provenance: Provenance, precision: str, source_id: str, source_store: str) -> Provenance:
    """The source's provenance with ``environment.storage`` describing the stored precision."""
    storage = Storage(
        precision=precision, scale=SCALE_SCHEME, source=StorageSource(variant=source_id, store=source_store)
    )
    return provenance.replace(environment=provenance.environment.replace(storage=storage))


def quantize_rows(x: torch.Tensor) -> tuple[Quantized, dict[str, float]]:
    """``x`` [N, H] quantized in blocks of rows, with the storage error record of the whole."""
    codes, scales, errs = [], [], []
    for a in range(0, max(1, x.shape[0]), QUANT_ROWS):
        part = x[a : a + QUANT_ROWS]
        q = quantize(part)
        errs.append(from_error_tensor(error_tensor(part, dequantize(q, torch.float32)).tolist()))
        codes.append(q.codes)
        scales.append(q.scales)
    return Quantized(torch.cat(codes), torch.cat(scales)), merge(errs)


def _unit_payload(
    reader: VariantReader, commit: CommitRecord, skip: set[str]
) -> tuple[list[SampleTokens], dict[int, Quantized], dict[int, torch.Tensor], dict[int, dict[str, float]]] | None:
    """(samples, quantized states, health tensors, error records) of the samples of ``commit`` that this
    unit holds for the reader (first unit wins) and that are not in ``skip``; None if there are none."""
    refs = [reader.refs[k] for k, _, _ in commit.samples if k not in skip and reader.refs[k].unit == commit.unit]
    if not refs:
        return None
    layers = reader.record.all_layers
    samples: list[SampleTokens] = []
    per_layer: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for ref in refs:
        ids, mask = reader.read_tokens(ref)  # checked against the key
        samples.append(SampleTokens(ref.key, ids, mask))
        for i, t in zip(layers, reader.read_layers(ref, layers)):
            per_layer[i].append(t)
    lengths = [s.length for s in samples]
    states: dict[int, Quantized] = {}
    health: dict[int, torch.Tensor] = {}
    errors: dict[int, dict[str, float]] = {}
    for i in layers:
        x = torch.cat(per_layer[i])
        health[i] = stats_tensor(x, lengths)
        states[i], errors[i] = quantize_rows(x)
    return samples, states, health, errors


def _source(target: str) -> tuple[str, Store, str, VariantReader]:
    """(path, store, variant id, reader) of the variant to convert; refused when it holds a damaged
    commit or is already stored quantized."""
    path, selector = split_target(target)
    source = Store.open(path)
    if selector:
        vid = source.select(selector)
    else:  # only a variant stored as computed can be a source: a derived one (even half done) is not a choice
        computed = {
            v: source.variant_record(v).provenance
            for v in source.variant_ids()
            if not source.variant_record(v).stored_precision
        }
        vid = select(computed, None, where=source.location) if computed else source.select(None)
    reader = source.reader(vid)
    reader.check_corrupt_commits()
    rec = reader.record
    if rec.stored_precision:
        raise BadInput(
            f"variant {vid} is already stored as {rec.stored_precision}; convert a variant stored as computed "
            f"({rec.dtype}) instead"
        )
    return path, source, vid, reader


class _Units:
    """Converts the source's units into the derived variant, side by side on threads; counts what it wrote.

    The derived variant (``variant``: create_variant's arguments) is recorded when its first unit is ready
    to commit: a convert that fails before (a damaged source) leaves no empty variant behind; one recorded
    before (a killed convert) is resumed."""

    def __init__(
        self,
        reader: VariantReader,
        out: Store,
        variant: VariantArgs,
        precision: str,
        allow_unhealthy: bool,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        self.reader, self.out, self.on_progress = reader, out, on_progress
        self.variant, self.precision, self.dvid = variant, precision, variant_id(variant[0])
        self.made = out.io.exists(layout.variant_meta(self.dvid))
        if self.made:
            out.create_variant(*variant, precision=precision)  # checks the recorded geometry
        self.check_health = not allow_unhealthy
        self.run = uuid.uuid4().hex[:8]
        done = UnitWriter(out, self.dvid, writer_id=f"convert-{self.run}").committed_keys() if self.made else set()
        self.done = set(done)
        self.present = sum(1 for k in reader.keys if k in self.done)
        self.writer: UnitWriter | None = None  # made with the variant's record (record())
        self.written = {"samples": 0, "tokens": 0, "bytes": 0}
        self.lock = threading.Lock()
        self.stopping = False  # set when the command is stopped: units not yet written are not started

    def one(self, index: int, commit: CommitRecord) -> None:
        if self.stopping:
            return
        payload = _unit_payload(self.reader, commit, self.done)
        if payload is None or self.stopping:
            return
        samples, states, health, errors = payload
        # one writer a run, its units in the source's order whatever order the threads finish in: a dataset over
        # the derived variant sees the source's sample order (a resumed run's units come after the earlier run's)
        writer = self.record()
        c = writer.write(samples, states, skip_committed=False, health=health, quant_error=errors, seq=index)
        if c is None:
            return
        with self.lock:
            self.written["samples"] += len(c.samples)
            self.written["tokens"] += c.n_tokens
            self.written["bytes"] += sum(c.files.values())
            self._progress()

    def record(self) -> UnitWriter:
        """Record the derived variant (once); its writer."""
        with self.lock:
            if not self.made:
                self.out.create_variant(*self.variant, precision=self.precision)
                self.made = True
            if self.writer is None:
                self.writer = UnitWriter(
                    self.out, self.dvid, writer_id=f"c-{self.run}", check_health=self.check_health, command="convert"
                )
            return self.writer

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.present + self.written["samples"], len(self.reader.keys))

    def all(self, workers: int) -> None:
        """Every unit. Stopped by a signal, queued units are dropped and the ones being written finish or stop
        before their commit, then the exception goes on."""
        self._progress()
        pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="hsstore-convert")
        try:
            for f in [pool.submit(self.one, i, c) for i, c in enumerate(self.reader.commits)]:
                f.result()
        except (Stopped, KeyboardInterrupt):
            self.stopping = True
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:  # (after an error in one unit the others still run: a re-run has less to do)
            pool.shutdown()

    def all_under_signals(self, workers: int) -> None:
        """Every unit (``all``), stopped by SIGINT, SIGTERM or SIGHUP: a BuildInterrupted saying how many samples
        are committed and kept. On any failure a store this convert made and left empty is removed."""
        try:
            with stop_on_signals():
                self.all(workers)
        except BaseException as e:
            if not self.made:  # a store this convert made, still empty and used by no other command: no trace
                self.out.discard_if_unused()
            if isinstance(e, Stopped):
                done = self.present + self.written["samples"]
                raise BuildInterrupted(
                    e.signum,
                    f"convert interrupted by {e}; {done} of {len(self.reader.keys)} samples of "
                    f"variant {self.dvid} are committed and kept: re-run the same command to "
                    "finish",
                ) from None
            raise


def _parsed(parse: Callable[[str], str], value: str) -> str:
    """``parse(value)`` for a precision or codec the command names; its ValueError as a BadInput."""
    try:
        return parse(value)
    except ValueError as e:
        raise BadInput(str(e)) from None


def _check_fits(out: Store, prov: dict[str, Any], label: str | None, another_model: bool) -> None:
    """Before anything is written: BadInput if the derived variant is of another model than ``out``'s
    (unless ``another_model``) or ``label`` names another variant there."""
    from hsstore.storage.names import another_model_allowed, check_label_free, check_model

    with another_model_allowed("convert" if another_model else None):
        check_model(out, prov, what="the converted variant")
    if label is not None:
        check_label_free(out, variant_id(prov), label)


def convert(
    target: str,
    precision: str,
    dest: str | None = None,
    workers: int | None = None,
    allow_unhealthy: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    codec: str | None = None,
    label: str | None = None,
    another_model: bool = False,
) -> ConvertReport:
    """Derive a ``precision`` variant of ``target`` ("STORE#SELECTOR") into ``dest`` (default: the same
    store), compressed with ``codec`` (default: the source's; see precision.codec_for_codes).
    ``on_progress(samples done, samples in all)`` is called at the start and as units finish.
    Returns what it converted and the storage error per layer (what ``--json`` prints)."""
    t0 = time.time()
    precision = _parsed(parse_precision, precision)
    path, source, vid, reader = _source(target)
    rec = reader.record
    out = Store.create(dest) if dest else Store.open(path, mode="a")
    prov = derived_provenance(rec.prov, precision, vid, source.location).to_dict()
    codec = codec_for_codes(_parsed(parse_codec, codec or rec.codec))
    variant: VariantArgs = (prov, rec.layers, rec.hidden_size, rec.dtype, codec, chunk_tokens(rec.hidden_size, 1))
    _check_fits(out, prov, label, another_model)
    units = _Units(reader, out, variant, precision, allow_unhealthy, on_progress)
    n = workers or min(4, os.cpu_count() or 1)
    units.all_under_signals(n)
    units.record()  # an empty source: the variant is recorded, as a build of nothing records it
    dvid = units.dvid
    if label:
        out.set_label(dvid, label, by="convert")
    if (kept := out.variant_record(dvid).codec) != codec:  # an existing variant: its units keep its codec
        print(kept_codec_note(dvid, kept, codec), file=sys.stderr, flush=True)
        codec = kept
    derived = out.reader(dvid, refresh=True)
    return ConvertReport(
        source=f"{source.location}#{vid}",
        variant=dvid,
        store=out.location,
        precision=precision,
        codec=codec,
        samples_converted=units.written["samples"],
        samples_present=units.present,
        tokens=units.written["tokens"],
        bytes=units.written["bytes"],
        seconds=time.time() - t0,
        workers=n,
        complete=all(k in derived.refs for k in reader.keys),
        error={str(i): summary(e) for i, e in derived.quant_error().items()},
    )


# --- Storage precision in a store: what an FP8 variant reports about itself, and the precision floor it is

FLOOR_TOKENS = 8192  # tokens of shared samples the floor is measured on (a few seconds of reading)
_DIFFERS = ("environment.dtype", "environment.storage")


def _recipe_key(provenance: dict[str, Any]) -> dict[str, Any]:
    """The numeric fields that must match for two variants to be "the same recipe and environment"
    (everything but the dtype computed in and the storage precision)."""
    return {
        k: v
        for k, v in numeric_fields(provenance).items()
        if not any(k == p or k.startswith(p + ".") for p in _DIFFERS)
    }


def floor_pair(store: Store, vid: str) -> tuple[str, str] | None:
    """(bf16 variant, fp32 variant) stored as computed with the same recipe and environment as ``vid``
    but for the dtype, or None. The bf16 one is the variant ``vid`` was computed as, when it is bf16."""
    records = {v: store.variant_record(v) for v in store.variant_ids()}
    want = _recipe_key(records[vid].provenance)
    found: dict[str, str] = {}
    for other, rec in sorted(records.items()):
        env = rec.prov.environment
        if is_set(env.storage) or _recipe_key(rec.provenance) != want:
            continue
        found.setdefault(env.dtype, other)
    if "bf16" in found and "fp32" in found:
        return found["bf16"], found["fp32"]
    return None


def measure_floor(store: Store, bf16: str, fp32: str, max_tokens: int = FLOOR_TOKENS) -> FloorMeasure:
    """rel-L2 of the bf16 states against the fp32 ones per layer, over the first shared samples (in
    the bf16 variant's order) up to ``max_tokens`` tokens."""
    a, b = store.reader(bf16), store.reader(fp32)
    layers = a.record.all_layers
    sums = {i: [0.0, 0.0] for i in layers}
    samples = tokens = 0
    for key in a.keys:
        if key not in b.refs:
            continue
        if tokens and tokens + a.refs[key].length > max_tokens:
            break
        for i, x, y in zip(layers, a.read_layers(a.refs[key], layers), b.read_layers(b.refs[key], layers)):
            d = x.float() - y.float()
            sums[i][0] += float(torch.linalg.vector_norm(d)) ** 2
            sums[i][1] += float(torch.linalg.vector_norm(y.float())) ** 2
        samples += 1
        tokens += a.refs[key].length
    rel = {str(i): (math.sqrt(e / r) if r > 0 else 0.0) for i, (e, r) in sums.items()}
    return FloorMeasure(bf16_variant=bf16, fp32_variant=fp32, samples=samples, tokens=tokens, rel_l2=rel)


def storage_report(store: Store, vid: str, floor_tokens: int = FLOOR_TOKENS) -> StorageReport | None:
    """For a variant stored in another precision than computed: its precision and scale, the source it
    was derived from (if converted), its storage error per layer, and the floor comparison when the
    store holds one. None for variants stored as computed."""
    reader = store.reader(vid)
    rec = reader.record
    if not rec.stored_precision:
        return None
    storage = rec.prov.environment.storage
    scale, source = (storage.scale, or_none(storage.source)) if isinstance(storage, Storage) else (None, None)
    error = {str(i): summary(e) for i, e in reader.quant_error().items()}
    pair = floor_pair(store, vid) if floor_tokens > 0 else None
    floor = measure_floor(store, *pair, max_tokens=floor_tokens) if pair is not None else None
    ratios = (
        None
        if floor is None
        else {i: (e.rel_l2 / floor.rel_l2[i] if floor.rel_l2.get(i) else None) for i, e in error.items()}
    )
    return StorageReport(
        precision=rec.stored_precision,
        scale=scale,
        source=source,
        computed_dtype=rec.dtype,
        error=error,
        floor=floor,
        error_vs_floor=ratios,
    )

"""Storage precision in a store: what an FP8 variant reports about itself, and the precision floor it is
judged against.

A variant stored as ``fp8-e4m3`` keeps, per committed unit, the storage error of its codes against the
states as computed (hsstore.core.quant_error). ``storage_report`` adds them up per layer and, where the
store also holds the bf16 and fp32 variants of the same recipe and environment (the precision floor of
``hsstore diff --floor``), measures that floor on a bounded set of shared samples and states the FP8
error as a multiple of it: below 1x, storing in FP8 costs less than computing in bf16 instead of fp32.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hsstore.core.provenance_match import numeric_fields
from hsstore.core.quant_error import summary
from hsstore.core.schema.record import is_set, or_none
from hsstore.core.schema.provenance import Storage
from hsstore.core.schema.storage_report import FloorMeasure, StorageReport

FLOOR_TOKENS = 8192  # tokens of shared samples the floor is measured on (a few seconds of reading)
_DIFFERS = ("environment.dtype", "environment.storage")


def _recipe_key(provenance: dict[str, Any]) -> dict[str, Any]:
    """The numeric fields that must match for two variants to be "the same recipe and environment"
    (everything but the dtype computed in and the storage precision)."""
    return {k: v for k, v in numeric_fields(provenance).items()
            if not any(k == p or k.startswith(p + ".") for p in _DIFFERS)}


def floor_pair(store: Any, vid: str) -> tuple[str, str] | None:
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


def measure_floor(store: Any, bf16: str, fp32: str, max_tokens: int = FLOOR_TOKENS) -> FloorMeasure:
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


def storage_report(store: Any, vid: str, floor_tokens: int = FLOOR_TOKENS) -> StorageReport | None:
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
    ratios = None if floor is None else {i: (e.rel_l2 / floor.rel_l2[i] if floor.rel_l2.get(i) else None)
                                         for i, e in error.items()}
    return StorageReport(precision=rec.stored_precision, scale=scale, source=source, computed_dtype=rec.dtype,
                         error=error, floor=floor, error_vs_floor=ratios)

"""What a store already holds of a planned build: for each (backend, dtype, device, precision) the variant
of the same recipe and environment, and which of the planned samples it has committed.

A variant's id also hashes the gated-delta and conv1d kernels the loaded model binds, which only a loaded
model tells (the backend asked for decides them); a plan matches every other field that changes numbers
(the recipe, the device type, dtype, backend, attention implementation, versions, batching and storage
precision), so a store variant computed with other versions is not counted as done (the build would
write a new variant).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from hsstore.core.provenance_match import numeric_fields

# environment fields a plan cannot know before a model is loaded (or that name this host)
_UNKNOWABLE = ("environment.kernels.chunk_gated_delta_rule", "environment.kernels.causal_conv1d",
               "environment.device_name", "environment.device_index",
               "environment.compute_capability", "environment.model_parallel")


@dataclass(frozen=True)
class Committed:
    """The store's variant for one planned run and its committed share of the planned samples."""

    variant: str | None
    keys: frozenset[str]  # the planned samples it has committed

    @property
    def samples(self) -> int:
        return len(self.keys)


def _key(provenance: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in numeric_fields(provenance).items() if not k.startswith(_UNKNOWABLE)}


NOTHING = Committed(None, frozenset())


def committed(store_path: str, expected: list[dict[str, Any]], keys: Collection[str]) -> list[Committed]:
    """For each ``expected`` provenance (kernels left as planned), the store variant whose knowable fields
    match and which of the planned ``keys`` it has committed (the variant with most of them). A store that
    does not exist yet holds nothing."""
    from pathlib import Path

    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.store import Store, check_not_nested

    try:
        store = Store.open(store_path)
    except StoreNotFound:
        if "://" not in store_path:
            check_not_nested(Path(store_path))  # what the build would refuse, the plan refuses
        return [NOTHING for _ in expected]
    fields = {vid: _key(store.variant_record(vid).provenance) for vid in store.variant_ids()}
    out = []
    for prov in expected:
        want = _key(prov)
        best = NOTHING
        for vid in sorted(v for v, k in fields.items() if k == want):
            refs = store.reader(vid).refs
            done = frozenset(k for k in keys if k in refs)
            if best.variant is None or len(done) > best.samples:
                best = Committed(vid, done)
        out.append(best)
    return out


@dataclass(frozen=True)
class StoreRatio:
    """Codec ratios measured on a store variant's committed files (same model, width, stored form, codec)."""

    variant: str
    tokens: int
    ratios: Any  # hsstore.storage.sizing.Ratios


def store_ratios(store_path: str, model_fingerprint: Any, hidden: int) -> dict[tuple[str, str], StoreRatio]:
    """(stored form, codec) -> the ratios the store's variants of this model and width reach on disk (the
    variant with most tokens per form): each layer's committed bytes, less the metadata, chunk and shard
    overheads the sizing adds itself, against its raw bytes. Nothing for a store that does not exist."""
    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.store import Store

    try:
        store = Store.open(store_path)
    except StoreNotFound:
        return {}
    out: dict[tuple[str, str], StoreRatio] = {}
    for vid in store.variant_ids():
        rec = store.variant_record(vid)
        if rec.hidden_size != hidden or rec.provenance.get("recipe", {}).get("model", {}).get("fingerprint") \
                != model_fingerprint or model_fingerprint in (None, "unknown"):
            continue
        found = _measured(store, vid, rec)
        if found is not None and found.tokens > out.get(found_key(rec), StoreRatio("", 0, None)).tokens:
            out[found_key(rec)] = found
    return out


def found_key(rec: Any) -> tuple[str, str]:
    """A variant record's (stored form, codec): what a planned run is matched on."""
    return (rec.stored_precision or rec.dtype, rec.codec)


def _measured(store: Any, vid: str, rec: Any) -> StoreRatio | None:
    """The variant's ratios per layer (FP8: its codes; scales apart) from its commit records' file sizes."""
    from hsstore.storage.sizing import Ratios, StoredForm, array_overhead

    form = StoredForm.of(rec.dtype, rec.stored_precision, rec.codec)
    if form.codec == "none":
        return None
    raw: dict[int, float] = {}
    stored: dict[int, float] = {}
    scale_raw = scale_stored = 0.0
    tokens = 0
    for c in store.commits(vid)[0]:
        n = c.n_tokens
        tokens += n
        for i in c.layers:
            size = {p: sum(b for rel, b in c.files.items() if rel.split("/")[0] == f"{p}_{i}") for p in ("layer", "scale")}
            over = array_overhead(n, rec.hidden_size, form)
            raw[i] = raw.get(i, 0) + n * rec.hidden_size * form.itemsize
            stored[i] = stored.get(i, 0) + max(1, size["layer"] - over[0])
            if form.quantized:
                scale_raw, scale_stored = scale_raw + 4 * n, scale_stored + max(1, size["scale"] - over[1])
    if not tokens or not raw:
        return None
    layers = {i: raw[i] / stored[i] for i in raw}
    return StoreRatio(vid, tokens, Ratios(sum(raw.values()) / sum(stored.values()), layers,
                                          scale_raw / scale_stored if scale_stored else 1.0))

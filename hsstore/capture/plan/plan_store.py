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

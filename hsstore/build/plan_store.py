"""What a store already holds of a planned build: for each (backend, dtype, device, precision) the variant
of the same recipe and environment, and which of the planned samples it has committed.

A variant's id also hashes the kernels the loaded model binds, which only a loaded model tells; a plan
matches every other field that changes numbers (the recipe, the device type, dtype, backend, versions,
batching and storage precision), so a store variant computed with other versions is not counted as done
(the build would write a new variant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hsstore.core.provenance import numeric_fields

# environment fields a plan cannot know before a model is loaded (or that name this host)
_UNKNOWABLE = ("environment.kernels.", "environment.device_name", "environment.device_index",
               "environment.compute_capability", "environment.model_parallel")


@dataclass(frozen=True)
class Committed:
    """The store's variant for one planned run and its committed share of the planned samples."""

    variant: str | None
    samples: int
    tokens: int


def _key(provenance: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in numeric_fields(provenance).items() if not k.startswith(_UNKNOWABLE)}


def committed(store_path: str, expected: list[dict[str, Any]], lengths: Mapping[str, int]) -> list[Committed]:
    """For each ``expected`` provenance (kernels left as planned), the store variant whose knowable fields
    match and how many of the samples in ``lengths`` (key -> tokens) it has committed. A store that does
    not exist yet holds nothing."""
    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.store import Store

    try:
        store = Store.open(store_path)
    except StoreNotFound:
        return [Committed(None, 0, 0) for _ in expected]
    keys = {vid: _key(store.variant_record(vid).provenance) for vid in store.variant_ids()}
    out = []
    for prov in expected:
        want = _key(prov)
        best = Committed(None, 0, 0)
        for vid in sorted(v for v, k in keys.items() if k == want):
            refs = store.reader(vid).refs
            done = [k for k in lengths if k in refs]
            if best.variant is None or len(done) > best.samples:
                best = Committed(vid, len(done), sum(lengths[k] for k in done))
        out.append(best)
    return out

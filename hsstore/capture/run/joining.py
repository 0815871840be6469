"""What a build checks before it joins a store (the store's one model, the label it gives) and what it
says after (the variants it made beside others, each with the selector that names it alone)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hsstore.core.errors import BadInput, HsstoreError
from hsstore.storage.names import another_model_allowed, check_model, labels
from hsstore.storage.store import Store


def new_variant_notes(store: Store, before: set[str], built: list[Any]) -> list[str]:
    """For each variant of ``built`` (a build's results: ``.variant``) not in ``before`` made beside others: what made it new and the selector
    that names it alone now that the command is over (said as each started, the next would outdate it)."""
    from hsstore.core.distinguish import fork_note

    provs = {}
    for v in store.variant_ids():
        try:
            provs[v] = store.variant_record(v).provenance
        except HsstoreError:  # an unreadable record is verify's to report
            continue
    found = labels(store)
    notes = [fork_note(vid, provs[vid], {v: p for v, p in provs.items() if v != vid}, found, every=provs)
             for vid in dict.fromkeys(r.variant for r in built if r.variant not in before and r.variant in provs)]
    return [n for n in notes if n]


def check_joining(m: Any, recipe: Mapping[str, Any]) -> None:
    """Before the build of manifest ``m`` (hsstore.core.schema.manifest.Manifest) writes anything or runs
    a model: BadInput if its store holds another model's states than ``recipe``'s (unless
    ``m.another_model``: the model is recorded as let in) or its label names a variant of another recipe
    or backend/dtype/device."""
    from hsstore.core.errors import StoreNotFound

    path, label, what = m.store_path, m.label, f"this build ({m.source})"
    another_model, run = "build" if m.another_model else None, (m.backends[0], m.dtypes[0], m.devices[0])
    try:
        store = Store.open(path, mode="a" if another_model else "r")
    except StoreNotFound:
        return  # a new store: nothing to join
    with another_model_allowed(another_model):
        check_model(store, {"recipe": dict(recipe)}, what=what)
    holder = next((v for v, lab in labels(store).items() if lab == label), None) if label else None
    if holder is None:
        return
    rec = store.variant_record(holder)
    env = rec.prov.environment
    if rec.provenance.get("recipe") != recipe or (env.backend, env.dtype, env.device) != (run[0], run[1], run[2].split(":")[0]):
        raise BadInput(f"label {label!r} already names variant {holder} in {path} (another recipe or "
                       "backend/dtype/device than this build's); choose another --label")

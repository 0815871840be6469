"""``require=``: a dataset refuses a variant of other provenance than the one required — a provenance
dict, another dataset, a VariantReader or 'STORE#SELECTOR' — naming every differing field, and what the
variant's audits found (an imported cache leaves fields unknown; an audit says whether its states agree)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsstore.core.errors import ProvenanceMismatch
from hsstore.core.provenance_match import require_match
from hsstore.storage.audits import audit_line, audits
from hsstore.storage.store import Store, VariantReader, split_target


def resolve_provenance(required: Any) -> dict[str, Any]:
    """A provenance from a dict, a dataset, a VariantReader or a 'STORE#SELECTOR' string."""
    if isinstance(required, Mapping):
        return dict(required)
    if isinstance(getattr(required, "reader", None), VariantReader):  # a HiddenStateDataset (either form)
        return required.provenance
    if isinstance(required, VariantReader):
        return required.record.provenance
    if isinstance(required, str):
        path, sel = split_target(required)
        s = Store.open(path)
        return s.variant_record(s.select(sel)).provenance
    raise TypeError(f"require= takes a provenance dict, a dataset or 'STORE#SELECTOR', not {type(required).__name__}")


def require_provenance(reader: VariantReader, required: Any, allow_drift: Iterable[str] = ()) -> None:
    """ProvenanceMismatch unless ``reader``'s variant has the ``required`` provenance (``allow_drift``: fields
    that may differ); the message ends with the variant's audits."""
    try:
        require_match(reader.record.provenance, resolve_provenance(required), allow_drift)
    except ProvenanceMismatch as e:
        notes = [f"variant {reader.id}: {audit_line(a)}" for a in audits(reader.store, reader.id)]
        raise ProvenanceMismatch(e.differences, notes=notes) from None

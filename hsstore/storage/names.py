"""Names in a store: a variant's human label (label records replayed in order: changed without rewriting
data, every change kept) and the one model a store holds unless a command was asked to let another in."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from hsstore.core.errors import BadInput, CorruptData, HsstoreError
from hsstore.core.provenance_match import identified, model_fingerprint, model_name, same_model
from hsstore.core.schema.store_records import LABEL_PATTERN, LabelRecord, ModelRecord
from hsstore.storage import layout

Store = Any  # hsstore.storage.store.Store (which imports this module)

# set by a command the user gave --another-model: create_variant lets a new model into a store of another
_ANOTHER_MODEL: ContextVar[str | None] = ContextVar("hsstore_another_model", default=None)


@contextmanager
def another_model_allowed(by: str | None) -> Iterator[None]:
    """Within it, a variant of another model than the store's is let in (``by``: the command that allows
    it, recorded with the model; None: refused as always)."""
    token = _ANOTHER_MODEL.set(by)
    try:
        yield
    finally:
        _ANOTHER_MODEL.reset(token)


def check_label(label: str) -> str:
    """BadInput unless ``label`` can be a variant's label."""
    if not LABEL_PATTERN.match(label):
        raise BadInput(
            f"label {label!r} is not a label: use letters, digits, '_', '-' and '.' (at most 64, "
            "starting with a letter or digit), e.g. sdpa-bf16"
        )
    return label


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def label_records(store: Store) -> list[tuple[int, LabelRecord]]:
    """Every label change, in order (the store's history of labels)."""
    keys = [k for k in store.io.list(layout.labels_prefix()) if layout.parse_key(k).kind == "label"]
    out = []
    for key in sorted(keys, key=layout.label_number):
        raw = store.io.get(key)
        if raw is not None:
            out.append((layout.label_number(key), LabelRecord.from_json(raw, f"label record {key}", CorruptData)))
    return out


def labels(store: Store, records: list[tuple[int, LabelRecord]] | None = None) -> dict[str, str]:
    """Variant id -> its label (the label records replayed: a later one moves or replaces a label)."""
    out: dict[str, str] = {}
    for _, rec in label_records(store) if records is None else records:
        out = {v: lab for v, lab in out.items() if lab != rec.label}
        out[rec.variant] = rec.label
    return out


def check_label_free(store: Store, vid: str | None, label: str, held: Mapping[str, str] | None = None) -> bool:
    """Whether variant ``vid`` (None: one not made yet) already holds ``label``; BadInput if it is not a label,
    another variant holds it, or it reads as a prefix of another variant's id (``#label`` would name two)."""
    check_label(label)
    held = labels(store) if held is None else held
    holder = next((v for v, lab in held.items() if lab == label), None)
    if holder == vid:
        return True
    if holder is not None:
        raise BadInput(
            f"label {label!r} already names variant {holder} in {store.location}; choose another "
            f"label, or first rename that one: hsstore label '{store.location}#label={label}' NEW"
        )
    prefixed = sorted(v for v in store.variant_ids() if v != vid and v.startswith(label))
    if prefixed:
        raise BadInput(
            f"label {label!r} reads as a prefix of variant {prefixed[0]}'s id in {store.location}: "
            f"#{label} would name two variants; choose a label with a letter past 'f' (e.g. v{label})"
        )
    return False


def set_label(store: Store, vid: str, label: str, by: str) -> str | None:
    """Give variant ``vid`` the label ``label`` (its previous one, if any, is returned); BadInput as
    ``check_label_free``. Atomic: each change is a new record claimed by number, so of two
    commands racing for one label exactly one gets it."""
    for _ in range(1000):
        records = label_records(store)
        held = labels(store, records)
        if check_label_free(store, vid, label, held):
            return label
        n = records[-1][0] + 1 if records else 0
        rec = LabelRecord(variant=vid, label=label, previous=held.get(vid), at=_now(), by=by)
        if store.io.put_if_absent(layout.label_key(n), json.dumps(rec.to_dict()).encode()):
            return rec.previous
    raise HsstoreError(f"could not record label {label!r}: label records keep changing; re-run the command")


def check_model(store: Store, provenance: Mapping[str, Any], what: str = "this variant") -> None:
    """BadInput (one line naming both models and the option) if ``provenance`` is of another model than
    the store's variants, unless the model was let in (a model record) or the caller allows it
    (``another_model_allowed``: the model record is written now)."""
    held = store.provenances(skip_unreadable=True)  # an unreadable record is verify's to report
    known = [p for p in held.values() if identified(p)]
    # a variant known by its shape only (an import given no model) vouches for no model: once the store holds
    # a known one, a model of the same shape must be that one (or be let in)
    if not held or any(
        same_model(p, provenance) for p in (known if known and identified(provenance) else held.values())
    ):
        return
    name = _model_record_name(provenance)
    if store.io.exists(layout.model_key(name)):
        return
    others = sorted({model_name(p) for p in known or held.values()})
    by = _ANOTHER_MODEL.get()
    if by is None:
        raise BadInput(
            f"{store.location} holds states of {', '.join(others)}; {what} is of another model, "
            f"{model_name(provenance)}: one store holds one model unless asked — pass --another-model "
            "(a manifest: [build] another_model = true) to keep both, or choose another --store"
        )
    rec = ModelRecord(
        name=model_name(provenance), fingerprint=model_fingerprint(provenance), beside=others, at=_now(), by=by
    )
    store.io.put_if_absent(layout.model_key(name), json.dumps(rec.to_dict()).encode())


def model_records(store: Store) -> list[ModelRecord]:
    """The models let in beside another (``--another-model``), in no particular order."""
    return [
        ModelRecord.from_json(raw, k, CorruptData)
        for k in store.io.list(layout.models_prefix())
        if layout.parse_key(k).kind == "model" and (raw := store.io.get(k)) is not None
    ]


def _model_record_name(provenance: Mapping[str, Any]) -> str:
    """The file name of a model's record: its fingerprint, else its config's."""
    from hsstore.core.keys import fingerprint

    model = provenance.get("recipe", {}).get("model", {})
    return (
        model_fingerprint(provenance)
        or "config-"
        + fingerprint({k: model.get(k) for k in ("config_fingerprint", "model_type", "num_layers", "hidden_size")})[:32]
    )

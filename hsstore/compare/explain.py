"""A diff that explains itself: what differs in the provenance of A, B (and the floor C), and the
comparisons it refuses because their answer would mislead (a floor that is A or B; states of two
different models or tokenizers)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.provenance_match import flatten, is_informational
from hsstore.core.schema.diff_report import FieldDifference
from hsstore.storage.store import VariantReader

ABSENT = "<absent>"
# fingerprints that say whose states these are; a different one means another model or tokenizer
IDENTITY = (("recipe.model.fingerprint", "model"), ("recipe.tokenizer.fingerprint", "tokenizer"))
UNKNOWN = (None, "", "unknown")


def store_identity(location: str) -> str:
    """One spelling per store: local paths resolved (``./s.zarr``, ``s.zarr/`` and symlinks alike),
    URLs without a trailing slash."""
    if "://" in location and not location.startswith("file://"):
        return location.rstrip("/")
    return os.path.realpath(location.removeprefix("file://"))


def same_variant(x: VariantReader, y: VariantReader) -> bool:
    return x.id == y.id and store_identity(x.store.location) == store_identity(y.store.location)


def check_floor(a: VariantReader, b: VariantReader, c: VariantReader, floor_target: str) -> None:
    """Refuse a floor that is A or B (its divergence from A would be 0, or B's own: every layer would read
    "within precision noise" by construction), and A or C stored at a reduced precision (A against C would
    then measure storage error, not precision noise)."""
    for name, x in (("A", a), ("B", b)):
        if same_variant(c, x):
            raise BadInput(f"the floor {floor_target!r} is {name} itself (variant {c.id} of {c.store.location}); a floor "
                           "must be a third variant whose divergence from A is pure precision (A's recipe in fp32 "
                           "when B is another kernel or device); to measure bf16 against fp32 itself, diff them "
                           "without --floor")
    for name, x in (("A", a), ("the floor C", c)):
        stored = x.record.stored_precision
        if stored:
            raise BadInput(f"{name} ({floor_target if x is c else 'variant ' + x.id}) is stored as {stored}: A against "
                           f"the floor would measure {stored} storage error, not precision noise, and hide "
                           "divergences up to that size; make A and C variants stored as computed (e.g. diff the "
                           f"{stored} variant as B against its source as A), or diff without --floor")


def _fingerprint(r: VariantReader, field: str) -> Any:
    return flatten(r.record.provenance).get(field)


def check_same_model(x: VariantReader, y: VariantReader, names: tuple[str, str], allow: bool) -> list[str]:
    """Refuse (unless ``allow``) two variants whose model or tokenizer fingerprints differ; returns
    notes for the report (what differs when allowed, what could not be checked)."""
    notes = []
    for field, what in IDENTITY:
        fx, fy = _fingerprint(x, field), _fingerprint(y, field)
        if fx in UNKNOWN or fy in UNKNOWN:
            notes.append(f"{what} identity of {names[0] if fx in UNKNOWN else names[1]} is not recorded: "
                         f"not checked that {names[0]} and {names[1]} come from the same {what}")
            continue
        if fx == fy:
            continue
        model = {v: flatten(v.record.provenance).get("recipe.model.name", "?") for v in (x, y)}
        if not allow:
            raise BadInput(f"{names[0]} and {names[1]} are states of different {what}s: {field} {fx!r} "
                           f"({model[x]}) != {fy!r} ({model[y]}); their divergence says nothing about precision. "
                           "Pass --allow-different-models to compare them anyway")
        notes.append(f"{names[0]} and {names[1]} are states of different {what}s ({field} {fx} != {fy}); "
                     "compared because --allow-different-models was given")
    return notes


def provenance_differences(a: Mapping[str, Any], b: Mapping[str, Any],
                           c: Mapping[str, Any] | None = None) -> list[FieldDifference]:
    """Every provenance field whose value is not the same in A, B (and C), numeric fields first."""
    flats = [flatten(p) for p in (a, b, c) if p is not None]
    fields = sorted(set().union(*flats))
    out = []
    for field in fields:
        values = [f.get(field, ABSENT) for f in flats]
        if all(v == values[0] for v in values[1:]):
            continue
        extra = {"c": values[2]} if c is not None else {}
        out.append(FieldDifference(field=field, a=values[0], b=values[1], informational=is_informational(field),
                                   **extra))
    return sorted(out, key=lambda d: (d.informational, d.field))

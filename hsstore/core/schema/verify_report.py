"""What ``hsstore verify --json`` prints, as typed records (stable keys, docs/json.md)."""

from __future__ import annotations

from hsstore.core.schema.record import Record


class Problem(Record):
    """One thing wrong with the store: the variant, sample key and unit it concerns (None: not one)."""

    variant: str | None
    key: str | None
    unit: str | None
    what: str


class VerifyReport(Record):
    ok: bool  # no problem found
    samples_checked: int
    problems: list[Problem]
    notes: list[str]  # not damage (debris of killed writers, wasted space of racing ones)

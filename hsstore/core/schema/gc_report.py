"""What ``hsstore gc --json`` prints, as typed records (stable keys, docs/json.md)."""

from __future__ import annotations

from hsstore.core.schema.record import Record


class Skipped(Record):
    """Something gc left in place, and why (it cannot be removed safely)."""

    what: str
    why: str


class GcReport(Record):
    removed_units: list[str]  # "<variant>/<unit>" (with dry_run: would be removed)
    removed_files: int
    kept_in_progress: list[str]  # "<variant>/<unit>" whose writer holds its lease or may still run
    skipped: list[Skipped]
    dry_run: bool

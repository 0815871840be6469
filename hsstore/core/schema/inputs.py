"""Records about input rows: each row a build did not take as it was (rejected, duplicate, truncated)."""

from __future__ import annotations

from typing import Literal

from hsstore.core.schema.record import UNSET, Record, UnsetType


class RowIssue(Record):
    """One named row: ``row`` is 1-based (the line of a .jsonl file, the element of a JSON list, the row of a
    parquet file or dataset folder). ``reason`` is the counted category; ``detail`` names the spot."""

    file: str
    row: int
    kind: Literal["rejected", "duplicate", "truncated", "empty_reply"]
    reason: str
    detail: str | UnsetType = UNSET

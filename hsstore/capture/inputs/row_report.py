"""InputReport: what tokenizing the data files gave, and every row not taken as it was, named with its reason.

Rows are named one by one up to ``NAMED_PER_REASON`` for each kind and reason; the rest of a reason are
counted, and one more issue names the first of them with how many followed. A 7.7 KB parquet file of two
million rows that are all rejected for one reason held 1.3 GB of issues and wrote a 295 MB ``rows.jsonl``
into the store (200 million rows, a few hundred KB on disk, would have needed 130 GB); the counts stay exact.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hsstore.capture.inputs.lossmask import METHOD
from hsstore.core.schema.inputs import RowIssue

NAMED_PER_REASON = 10_000  # rows named one by one for each (kind, reason); the rest are counted


@dataclass
class InputReport:
    rows: int = 0
    usable: int = 0
    truncated: int = 0
    replies_dropped: int = 0  # trained replies (loss-mask runs) that truncation cut off whole
    duplicates: int = 0
    empty_replies: int = 0  # kept rows with an empty trained reply among others (rows of only empty ones: rejected)
    rejected: Counter = field(default_factory=Counter)
    issues: list[RowIssue] = field(default_factory=list)  # rejected, duplicate and truncated rows, in order
    named: Counter = field(default_factory=Counter)  # (kind, reason) -> rows named in ``issues``
    unnamed: dict[tuple[str, str], list] = field(default_factory=dict)  # (kind, reason) -> [file, row, count]
    summarized: set[tuple[str, str]] = field(default_factory=set)  # reasons ``close`` named the unnamed rows of

    def note(self, kind: str, file: str, row: int, reason: str, detail: str = "") -> None:
        if self.named[(kind, reason)] >= NAMED_PER_REASON:
            self.unnamed.setdefault((kind, reason), [file, row, 0])[2] += 1
            return
        self.named[(kind, reason)] += 1
        self.issues.append(RowIssue(file=file, row=row, kind=kind, reason=reason, **({"detail": detail} if detail else {})))

    def close(self) -> None:
        """Add one issue for each reason whose rows were not all named: the first unnamed row, and how many
        (once; later calls add nothing)."""
        for (kind, reason), (file, row, n) in self.unnamed.items():
            if (kind, reason) not in self.summarized:
                self.summarized.add((kind, reason))
                self.issues.append(RowIssue(file=file, row=row, kind=kind, reason=reason, detail=(
                    f"this row and {n - 1:,} more {kind} for this reason, not named one by one (the first "
                    f"{NAMED_PER_REASON:,} are)")))

    @property
    def issue_count(self) -> int:
        """Rows not taken as they were: every one counted, named or not."""
        return sum(self.named.values()) + sum(n for _, _, n in self.unnamed.values())

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "usable": self.usable, "truncated": self.truncated,
                "replies_dropped": self.replies_dropped, "empty_replies": self.empty_replies,
                "duplicates": self.duplicates, "rejected": dict(self.rejected), "issue_count": self.issue_count,
                "loss_mask": METHOD}

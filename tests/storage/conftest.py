"""Storage tests: the fuzz suite's outcome counts, summed over every test item (xdist workers too)."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    total: Counter = Counter()
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "fuzz":
                total.update(value)
    if total:
        terminalreporter.write_line(
            f"store fuzz: {sum(total.values())} mutated stores tried: "
            + ", ".join(f"{k} {v}" for k, v in sorted(total.items()))
        )

"""Sizes and durations as people read them (pure): three significant digits and a unit."""

from __future__ import annotations


def byte_size(n: float | None) -> str:
    """``n`` bytes as "1.24 GB", "981 kB" or "12 B" (decimal units, as disks are sold); "unknown" for None."""
    if n is None:
        return "unknown"
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float | None) -> str:
    """``seconds`` as "5.71 s" or "3.2 h"; "unknown" for None."""
    if seconds is None:
        return "unknown"
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds:.3g} s"

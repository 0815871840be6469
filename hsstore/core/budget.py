"""The memory budget every reader of foreign input checks *before* it allocates: declared shapes, inflated
sizes, configs and vocabularies are priced first, and refused in one line when they would not fit.

The budget is half the memory the OS reports available (``MemAvailable``), or ``HSSTORE_MEMORY_BUDGET``
(bytes, or with a K/M/G/T suffix: decimal units, as core.humanize prints them) when set: the trade-off is a refusal of an input that might just have
fit, against a machine driven into swap or the OOM killer by a file of a few kilobytes.
"""

from __future__ import annotations

import functools
import os
import re

from hsstore.core.errors import ResourceLimit
from hsstore.core.humanize import byte_size

ENV = "HSSTORE_MEMORY_BUDGET"
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_bytes(text: str, what: str = ENV) -> int:
    """``"512M"`` -> 512000000; a one-line error for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", text.upper())
    if m is None:
        raise ResourceLimit(f"{what}={text!r} is not a size; write bytes or a number with K, M, G or T (e.g. 8G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def available_memory() -> int:
    """Bytes the OS says can be allocated without swapping (``MemAvailable``; free pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40  # no way to ask: no memory-based refusal


@functools.lru_cache(maxsize=1)
def physical_memory() -> int:
    """Bytes of memory this machine has (``MemTotal``): no allocation larger than this can be meant."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def memory_budget() -> int:
    """Bytes one command may allocate for foreign input: ``HSSTORE_MEMORY_BUDGET`` or half of available."""
    env = os.environ.get(ENV)
    return parse_bytes(env) if env else available_memory() // 2


def check_fits(nbytes: int | float, what: str, fix: str, share: int = 1) -> None:
    """Refuse (ResourceLimit, exit 2) when ``what`` needs more than ``1/share`` of the memory budget;
    ``share`` is how many such allocations may be live at once (e.g. reader threads)."""
    budget = memory_budget() // max(1, share)
    if nbytes > budget:
        raise ResourceLimit(f"{what} needs {byte_size(nbytes)}, more than the {byte_size(budget)} memory budget "
                            f"({budget_source()}); {fix}")


def budget_source() -> str:
    """How the budget was set, for an error message."""
    return f"{ENV}" if os.environ.get(ENV) else f"half of available memory; set {ENV} to change it"

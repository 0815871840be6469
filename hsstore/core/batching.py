"""Token-budget batching: length-sorted batches whose padded size stays within a budget (pure).

Padded lengths are bucketed (``padded_length``): a batch is padded to the next of at most 16 widths per
octave, each a multiple of 64. Every distinct batch shape makes the fla/triton kernels compile and
autotune once on a fresh host (hundreds of cache files, ~14 s per rank on an H200), so a build sees a
few dozen shapes instead of one per distinct longest sample; the price is under 6.25 % more padded
tokens per batch at worst (~3 % on average). The plan is made once for all ranks, so a sample is padded
the same way whatever the world size.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence

from hsstore.core.errors import ResourceLimit
from hsstore.core.outputs import byte_size

PER_OCTAVE = 16
MIN_STEP = 64
POLICY = f"{PER_OCTAVE}-per-octave-multiple-of-{MIN_STEP}"  # recorded in provenance (environment.batching)


def padded_length(n: int, per_octave: int = PER_OCTAVE, min_step: int = MIN_STEP) -> int:
    """The width a batch whose longest sample has ``n`` tokens is padded to: ``n`` rounded up to a
    multiple of ``max(min_step, 2**floor(log2 n) / per_octave)``."""
    if n <= 0:
        return 0
    step = max(min_step, (1 << (int(n).bit_length() - 1)) // per_octave)
    return -(-int(n) // step) * step


def token_budget_batches(lengths: Sequence[int], budget: int, bucketed: bool = True) -> list[list[int]]:
    """Indices grouped so that ``len(batch) * width <= budget``, where width is the batch's padded
    length (``padded_length`` of its longest sample, or the longest itself if not ``bucketed``);
    longest first. Sorting by length keeps padding low; a sample too long for the budget gets a
    batch of its own. Returns: list of batches, each a list of indices into ``lengths``.
    """
    pad = padded_length if bucketed else (lambda n: n)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        w = max(width, pad(lengths[i]))
        if current and w * (len(current) + 1) > budget:
            batches.append(current)
            current, w = [], pad(lengths[i])
        current.append(i)
        width = w
    if current:
        batches.append(current)
    return batches


def batch_shapes(
    lengths: Sequence[int], batches: Sequence[Sequence[int]], bucketed: bool = True
) -> set[tuple[int, int]]:
    """The distinct padded shapes ``(batch size, width)`` a plan runs (each compiles kernels once)."""
    pad = padded_length if bucketed else (lambda n: n)
    return {(len(b), pad(max(lengths[i] for i in b))) for b in batches if b}


# --- How a build cuts its stream of batches into units of work (pure): the rule the capture pipeline

# a unit (one writer's atomic piece of work) holds about this many bytes of states: large enough that
# per-unit costs vanish, small enough that the pinned host buffers in flight and the work lost to a
# crash stay bounded (a 27B target: ~20k tokens of 5 layers x 5120 x bf16)
UNIT_BYTES = 1 << 30


def default_unit_tokens(hidden: int, itemsize: int, n_layers: int) -> int:
    """Tokens per unit when the manifest leaves ``unit_tokens`` out: about ``UNIT_BYTES`` of states."""
    return max(1, UNIT_BYTES // max(1, hidden * itemsize * n_layers))


def flush_due(tokens: int, unit_tokens: int, remaining: int) -> bool:
    """Whether a unit holding ``tokens`` flushes now, with ``remaining`` tokens still to compute."""
    return tokens >= (unit_tokens if remaining >= unit_tokens else max(1, unit_tokens // 4))


def batch_units(batch_tokens: Sequence[int], unit_tokens: int) -> list[int]:
    """The unit each batch of ``batch_tokens`` tokens (in run order) is written in: unit indices, ascending."""
    remaining = sum(batch_tokens)
    out: list[int] = []
    unit = held = 0
    for n in batch_tokens:
        out.append(unit)
        held += n
        remaining -= n
        if flush_due(held, unit_tokens, remaining):
            unit, held = unit + 1, 0
    return out


def unit_sizes(batch_tokens: Sequence[int], unit_tokens: int) -> list[int]:
    """The tokens of each unit a build writes from batches of ``batch_tokens`` tokens (in run order)."""
    sizes: dict[int, int] = {}
    for unit, n in zip(batch_units(batch_tokens, unit_tokens), batch_tokens):
        sizes[unit] = sizes.get(unit, 0) + n
    return [sizes[u] for u in sorted(sizes)]


# --- The memory budget every reader of foreign input checks *before* it allocates: declared shapes, inflated

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
        raise ResourceLimit(
            f"{what} needs {byte_size(nbytes)}, more than the {byte_size(budget)} memory budget "
            f"({budget_source()}); {fix}"
        )


def budget_source() -> str:
    """How the budget was set, for an error message."""
    return f"{ENV}" if os.environ.get(ENV) else f"half of available memory; set {ENV} to change it"

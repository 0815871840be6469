"""How a build cuts its stream of batches into units of work (pure): the rule the capture pipeline
flushes by, and the unit sizes it gives, so a plan predicts the units a build will write.

A unit flushes once it holds ``unit_tokens``; once fewer than that are left to compute, units flush at a
quarter of the size (their writes overlap the last forwards, so the tail after the last forward stays
short). The price is a few more, smaller units at the end of every build.
"""

from __future__ import annotations

from collections.abc import Sequence

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

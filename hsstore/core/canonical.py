"""Canonical JSON and the xxh3_128 fingerprints built on it."""

from __future__ import annotations

import json
import math
from typing import Any

import xxhash


def _normalize(value: Any) -> Any:
    # floats that are whole numbers hash like ints; tuples like lists; NaN is refused
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"canonical JSON refuses non-finite float {value!r}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    raise TypeError(f"canonical JSON cannot encode {type(value).__name__}: {value!r}")


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only, whole floats as ints: the same value gives the same text."""
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(value: Any) -> str:
    """xxh3_128 hex digest of ``canonical_json(value)``."""
    return xxhash.xxh3_128_hexdigest(canonical_json(value).encode("ascii"))

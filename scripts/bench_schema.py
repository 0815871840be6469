"""How fast typed, strict decoding of store records is, against plain json.loads and pydantic v2 strict.

Decodes a commit record of N samples (what every store open reads per unit) with: json.loads alone (no
checking), hsstore's msgspec Record (hsstore.core.schema), and an equivalent pydantic v2 model in strict
mode (if pydantic is installed). Same process, same bytes, best of repeats.

    python scripts/bench_schema.py --samples 5000
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import msgspec

from hsstore.core.schema.record import Record


class Commit(Record):
    unit: str
    samples: list[tuple[str, int, int]]
    layers: list[int]
    files: dict[str, int]
    stats: dict[str, dict[str, float]]
    writer: dict[str, Any] = {}
    committed_at: str = ""


def _pydantic_twin(pydantic: Any, record: type) -> type:
    """A strict, frozen pydantic model with the fields (names, types, defaults) of the msgspec ``record``."""
    fields = {}
    for f in msgspec.structs.fields(record):
        if f.required:
            fields[f.name] = (f.type, ...)
        elif f.default_factory is not msgspec.NODEFAULT:  # e.g. {}: pydantic copies mutable defaults itself
            fields[f.name] = (f.type, f.default_factory())
        else:
            fields[f.name] = (f.type, f.default)
    config = pydantic.ConfigDict(strict=True, frozen=True, extra="forbid")
    return pydantic.create_model(f"{record.__name__}Pydantic", __config__=config, **fields)


def _record(n: int) -> bytes:
    return json.dumps(
        {
            "unit": "w-000001",
            "samples": [[f"{i:032x}", i * 100, 100] for i in range(n)],
            "layers": [1, 16, 31, 46, 61],
            "files": {f"layer_{i}/c/0/0": 123 for i in (1, 16, 31, 46, 61)},
            "stats": {str(i): {"n": 1.0, "sum": 2.0, "sumsq": 3.0} for i in (1, 16, 31, 46, 61)},
            "writer": {"host": "h", "pid": 1, "writer": "w"},
            "committed_at": "2026-12-01T00:00:00+00:00",
        }
    ).encode()


def _best(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    raw = _record(args.samples)
    decoder = msgspec.json.Decoder(Commit, strict=True)
    rows = {
        "json.loads (no checks)": _best(lambda: json.loads(raw), args.repeats),
        "msgspec Record (strict)": _best(lambda: decoder.decode(raw), args.repeats),
    }
    try:
        import pydantic

        P = _pydantic_twin(pydantic, Commit)

        rows["pydantic v2 strict (from JSON)"] = _best(lambda: P.model_validate_json(raw), args.repeats)
    except ImportError:
        pass
    base = rows["json.loads (no checks)"]
    print(f"commit record of {args.samples} samples, {len(raw):,} bytes; best of {args.repeats}")
    for name, ms in rows.items():
        print(f"  {name:32s} {ms:7.2f} ms  ({ms / base:.2f}x json.loads)")


if __name__ == "__main__":
    main()

"""Reading and writing a store's JSON metadata: bounded parsing, zarr group documents, the typed records.

Every metadata file is read with a size cap (``MAX_RECORD_BYTES``) and parsed with bounded nesting
(``MAX_DEPTH``), so a damaged or hostile store gives a one-line CorruptData, never a hang, an unbounded
read or a RecursionError traceback. The records themselves are typed in hsstore.core.schema.store_records.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from hsstore.core.errors import CorruptData
from hsstore.core.nesting import nesting_depth
from hsstore.core.schema.record import explain
from hsstore.core.schema.store_records import CommitRecord, HealthStats, UnitInfo, VariantRecord, WriterInfo

__all__ = ["MAX_DEPTH", "MAX_RECORD_BYTES", "CommitRecord", "HealthStats", "UnitInfo", "VariantRecord",
           "WriterInfo", "convert_strict", "group_json", "parse_json"]

# the largest metadata file hsstore writes is a commit record: ~50 bytes per sample, so a unit of
# 100,000 short samples is ~5 MB; 64 MiB leaves room and still bounds what a reader takes in
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 32  # deepest hsstore writes: provenance, about 6 levels


def group_json(attributes: dict[str, Any]) -> bytes:
    """zarr v3 group metadata carrying ``attributes``, so any zarr reader opens the hierarchy."""
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes}, indent=1).encode()


def parse_json(data: bytes, what: str) -> Any:
    """JSON only (never pickle), nested at most ``MAX_DEPTH`` deep; a one-line CorruptData naming ``what``."""
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError) as e:
        raise CorruptData(f"{what} is not valid JSON ({str(e)[:120]}); run `hsstore verify`") from None
    if nesting_depth(value, stop=MAX_DEPTH) > MAX_DEPTH:
        raise CorruptData(f"{what} nests deeper than {MAX_DEPTH} levels; hsstore never writes that")
    return value


def convert_strict(value: Any, type_: Any, what: str) -> Any:
    """Parsed JSON ``value`` as ``type_`` (a zarr document: unknown keys allowed, known ones typed strictly);
    a one-line CorruptData naming ``what`` and the offending key otherwise."""
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as e:
        raise CorruptData(f"{what}: {explain(e, value)}") from None

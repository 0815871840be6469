"""The typed records hsstore persists and exchanges (manifest, provenance, store records, plans,
results, reports), each a frozen msgspec Struct with strict ``from_dict`` / ``to_dict``."""

from hsstore.core.schema.record import UNSET, Record, UnsetType, decode_json, is_set

__all__ = ["UNSET", "Record", "UnsetType", "decode_json", "is_set"]

"""What ``hsstore convert --json`` prints, as a typed record (stable keys, docs/json.md)."""

from __future__ import annotations

from hsstore.core.schema.record import Record
from hsstore.core.schema.storage_report import StorageError


class ConvertReport(Record):
    source: str  # STORE#VARIANT_ID converted from
    variant: str  # the derived variant's id ...
    store: str  # ... and the store it is in
    precision: str
    codec: str
    samples_converted: int  # by this run
    samples_present: int  # committed by an earlier run
    tokens: int
    bytes: int
    seconds: float
    workers: int
    complete: bool  # every sample of the source is in the derived variant
    error: dict[str, StorageError]  # layer -> storage error against the source, all samples

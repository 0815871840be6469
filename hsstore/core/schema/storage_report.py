"""How a variant stored in another precision than computed (FP8) reports itself, as typed records: its
storage error per layer (``hsstore convert --json``'s ``error``, ``hsstore info --json``'s ``storage``)
and the bf16-vs-fp32 precision floor it is judged against. Keys are stable (docs/json.md)."""

from __future__ import annotations

from hsstore.core.schema.provenance import StorageSource
from hsstore.core.schema.record import Record


class StorageError(Record):
    """The stored states against the states as computed, over all tokens of one layer."""

    tokens: int
    rel_l2: float  # ||stored - computed|| / ||computed|| over all values
    cos_mean: float  # per-token cosine
    cos_min: float
    max_abs: float


class FloorMeasure(Record):
    """rel-L2 of the bf16 variant against the fp32 one of the same recipe, over the first shared samples."""

    bf16_variant: str
    fp32_variant: str
    samples: int
    tokens: int
    rel_l2: dict[str, float]  # layer -> rel-L2


class StorageReport(Record):
    """An FP8 variant: precision and scale, the variant it was converted from (None: quantized at build
    time), its error per layer and, where the store holds the floor, the error as a multiple of it."""

    precision: str
    scale: str | None
    source: StorageSource | None
    computed_dtype: str
    error: dict[str, StorageError]  # layer -> error
    floor: FloorMeasure | None
    error_vs_floor: dict[str, float | None] | None  # layer -> FP8 error / the floor's rel-L2

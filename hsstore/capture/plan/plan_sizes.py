"""Sizes of the variants a manifest builds, from its tokenized samples and the build's own batch plan:
bytes per variant and layer, what the store has already committed, and the space the build still needs.
Shared by ``hsstore plan`` and the space check ``hsstore build`` runs before any model loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hsstore.capture.plan.plan_store import Committed
from hsstore.core.batching import padded_length
from hsstore.core.unitplan import default_unit_tokens, unit_sizes
from hsstore.storage.sizing import (Ratios, StoredForm, assumed_error, assumed_ratio, commit_bytes, files_per_unit,
                                    unit_bytes, variant_bytes)


@dataclass(frozen=True)
class Run:
    """One variant the build writes."""

    backend: str
    dtype: str
    device: str
    precision: str | None


@dataclass(frozen=True)
class VariantSize:
    """One variant's planned size: by part, with the ratio it rests on, its committed share and remainder."""

    run: Run
    form: StoredForm
    units: int
    parts: dict[str, int]  # "tokens" / "layer_<i>" -> bytes (scaled to the whole data when sampled)
    ratio: float
    ratio_source: str
    measured: bool
    ratio_error: float | None  # the expected relative error of the bytes the ratio gives (None: unbounded)
    committed: Committed
    committed_tokens: int  # of the tokenized samples (unscaled)
    remaining_bytes: int
    remaining_batches: list[list[int]]  # batches with a sample not committed: what the build still runs
    largest_file: int = 0  # bytes of the largest file still to write (a layer of the largest unit left)

    @property
    def bytes(self) -> int:
        """Every unit file of the variant: what ``hsstore info`` reports."""
        return sum(self.parts.values())


def runs(m: Any) -> list[Run]:
    """Every variant of the manifest, in the order the build writes them."""
    return [Run(b, d, dev, m.precision) for b in m.backends for d in m.dtypes for dev in m.devices]


def batch_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> list[int]:
    """Tokens of each batch (indices into ``lengths``)."""
    return [sum(lengths[i] for i in b) for b in batches]


def batch_shapes(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(rows, padded width) of each batch, as the capture pads them."""
    return [(len(b), padded_length(max(lengths[i] for i in b))) for b in batches if b]


@dataclass(frozen=True)
class Measured:
    """Codec ratios measured for a run, where, and the expected relative error of the bytes they give."""

    ratios: Ratios
    source: str
    error: float


def size_variant(m: Any, run: Run, lengths: list[int], keys: list[str], batches: list[list[int]],
                 geometry: tuple[int, list[int]], committed: Committed, found: Measured | None,
                 scale: float = 1.0) -> VariantSize:
    """``run``'s bytes over the samples (``lengths``, ``keys``) cut into units as the build cuts them;
    ``found``: measured ratios, or None to assume; ``scale``: sampled tokens -> all tokens."""
    hidden, layers = geometry
    form = StoredForm.of(run.dtype, run.precision, m.codec)
    if found is None:
        value, source = assumed_ratio(form.form, form.codec)
        ratios, measured, error = Ratios(value), False, assumed_error(form.form, form.codec)
    else:
        ratios, value, source, measured, error = found.ratios, found.ratios.default, found.source, True, found.error
    if form.codec == "none":
        value, source, error = 1.0, "no codec", 0.01
    unit_tokens = m.unit_tokens or default_unit_tokens(hidden, form.itemsize, len(layers))
    units = unit_sizes(batch_tokens(lengths, batches), unit_tokens)
    parts = {k: int(v * scale) for k, v in variant_bytes(units, hidden, layers, form, ratios).items()}
    done = committed.keys
    left = [b for b in batches if any(keys[i] not in done for i in b)]
    left_units = unit_sizes([sum(lengths[i] for i in b if keys[i] not in done) for b in left], unit_tokens)
    remaining = int(sum(variant_bytes(left_units, hidden, layers, form, ratios).values()) * scale) if left_units else 0
    tokens_done = sum(n for n, k in zip(lengths, keys) if k in done)
    largest = max(unit_bytes(max(left_units), hidden, layers, form, ratios).values()) if left_units else 0
    return VariantSize(run, form, len(units), parts, value, source, measured, error, committed, tokens_done, remaining,
                       left, largest)


def needed_bytes(sizes: list[VariantSize], samples: int, block: int) -> int:
    """What the build still writes to disk (``samples``: of the whole data): the remaining bytes of every
    variant, their commit records and, per file, up to one allocation block of rounding."""
    total = 0
    for v in sizes:
        if not v.remaining_bytes:
            continue
        n_layers = sum(1 for k in v.parts if k.startswith("layer_"))
        share = v.remaining_bytes / max(1, v.bytes)
        units = max(1, round(v.units * share))
        total += v.remaining_bytes + commit_bytes(round(samples * share), units, n_layers)
        total += units * files_per_unit(n_layers, v.form.quantized) * block
    return total

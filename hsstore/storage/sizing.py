"""Bytes a variant takes in a store, from its tokens, geometry, stored form and codec ratio (pure: no I/O).

It follows the writer file by file (hsstore.storage.writer): each unit holds ``input_ids`` and
``loss_mask`` (no codec), one array per layer (the computed dtype, or FP8 e4m3 codes plus a float32
per-token scale array) and a group ``zarr.json``; each array is a ``zarr.json`` and one shard whose
chunks carry a crc32c and an index entry, the last chunk padded to full size (zeros: free under a
codec, full price without one). What it cannot know is how well the codec compresses the states:
that ratio is an input, measured by ``hsstore plan --calibrate`` or taken from ``ASSUMED_RATIOS``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hsstore.core.dtypes import STORED
from hsstore.core.precision_names import codec_for_codes
from hsstore.storage.codecs import SCALE_CHUNK_ROWS, TOKEN_CHUNK_ROWS, chunk_tokens
from hsstore.storage.store import is_url

FORMS = ("bf16", "fp16", "fp32", "fp8-e4m3")  # every way a layer can be stored
METADATA_BYTES = 1400  # one array's zarr.json as zarr 3.x writes it (1,354 bytes for a layer array)
UNIT_GROUP_BYTES = 300  # a unit's group zarr.json (its writer's host, pid, id and start time)
CHUNK_OVERHEAD = 4 + 16  # per chunk: its crc32c and its shard-index entry
SHARD_OVERHEAD = 4  # per shard: the index's crc32c
COMMIT_BYTES_PER_SAMPLE = 60  # a commit record's line per sample (key, offset, length)
COMMIT_BYTES_PER_LAYER = 400  # ... its health statistics, file sizes and checksums per layer
DOCS = 'docs/benchmarks.md, "Codecs" and "FP8 storage"'
# (form, codec) -> (raw bytes / stored bytes of the states, where the figure comes from); the low end of
# what was measured, so the size check errs towards refusing; unmeasured pairs assume no compression
ASSUMED_RATIOS: dict[tuple[str, str], tuple[float, str]] = {
    ("bf16", "shuffle-zstd"): (
        1.42,
        f"{DOCS}: 1.42-1.48x on bf16 model states (1.47x in a 27B-shaped build on an H200)",
    ),
    ("bf16", "zstd"): (1.24, f"{DOCS}: 1.24-1.30x on bf16 model states"),
    ("bf16", "blosc-lz4"): (1.14, f"{DOCS}: 1.14-1.22x on bf16 model states"),
    ("bf16", "blosc-zstd"): (1.04, f"{DOCS}: 1.04-1.13x on bf16 model states"),
    ("fp8-e4m3", "zstd"): (
        1.11,
        f"{DOCS}: e4m3 codes and scales 2.22x smaller than raw bf16 with zstd-1, 2.00x without",
    ),
}


def assumed_ratio(form: str, codec: str) -> tuple[float, str]:
    """(ratio, its source) for states stored as ``form`` with ``codec`` when nothing was measured."""
    if codec == "none":
        return 1.0, "no codec"
    return ASSUMED_RATIOS.get(
        (form, codec),
        (
            1.0,
            f"not measured for {form} with {codec}: no compression assumed "
            "(run hsstore plan --calibrate N to measure it)",
        ),
    )


ASSUMED_ERROR = 0.25  # a table entry's bytes against a build of another model (docs/plan.md: how it was tested)


def assumed_error(form: str, codec: str) -> float | None:
    """The expected relative error of bytes sized with ``assumed_ratio``; None where no compression is
    assumed for a codec that compresses (the bytes are then an upper bound, not an estimate)."""
    if codec == "none":
        return 0.01
    return ASSUMED_ERROR if (form, codec) in ASSUMED_RATIOS else None


@dataclass(frozen=True)
class StoredForm:
    """How a variant stores its layers: ``form`` (a dtype, or "fp8-e4m3"), bytes per value, the codec
    its layer arrays are written with (FP8 codes: ``codec_for_codes``)."""

    form: str
    itemsize: int
    codec: str

    @property
    def quantized(self) -> bool:
        return self.form == "fp8-e4m3"

    @classmethod
    def of(cls, dtype: str, precision: str | None, codec: str) -> StoredForm:
        if precision:
            return cls(precision, 1, codec_for_codes(codec))
        return cls(dtype, STORED[dtype].itemsize, codec)


@dataclass(frozen=True)
class Ratios:
    """Raw / stored bytes of each layer's states (``layers``; ``default`` for any other) and of FP8 scales."""

    default: float
    layers: dict[int, float] = field(default_factory=dict)
    scales: float = 1.0

    def of(self, layer: int) -> float:
        return self.layers.get(layer, self.default)


def _shard(rows: int, chunk: int, row_bytes: int, ratio: float | None) -> int:
    """Bytes of one array (metadata and shard) of ``rows`` rows; ``ratio`` None: stored without a codec."""
    c = min(chunk, max(1, rows))
    chunks = -(-rows // c)
    payload = chunks * c * row_bytes if ratio is None else rows * row_bytes / ratio
    return int(round(payload)) + chunks * CHUNK_OVERHEAD + SHARD_OVERHEAD + METADATA_BYTES


def array_overhead(rows: int, hidden: int, form: StoredForm) -> tuple[int, int]:
    """Bytes of a layer array (and of its FP8 scales array) of ``rows`` rows that are not the encoded
    states: metadata, chunk checksums and index, the shard's checksum (what ``_shard`` adds to a payload)."""
    layer = _shard(rows, chunk_tokens(hidden, form.itemsize), hidden * form.itemsize, float("inf"))
    return layer, (_shard(rows, SCALE_CHUNK_ROWS, 4, float("inf")) if form.quantized else 0)


def unit_bytes(tokens: int, hidden: int, layers: list[int], form: StoredForm, ratios: Ratios) -> dict[str, int]:
    """Bytes of one unit of ``tokens`` tokens by part: "tokens" (ids, mask, group metadata), "layer_<i>"
    (with its scales when FP8)."""
    compressed = form.codec != "none"
    c = chunk_tokens(hidden, form.itemsize)
    out = {
        "tokens": _shard(tokens, TOKEN_CHUNK_ROWS, 4, None)
        + _shard(tokens, TOKEN_CHUNK_ROWS, 1, None)
        + UNIT_GROUP_BYTES
    }
    for i in layers:
        n = _shard(tokens, c, hidden * form.itemsize, ratios.of(i) if compressed else None)
        if form.quantized:
            n += _shard(tokens, SCALE_CHUNK_ROWS, 4, ratios.scales if compressed else None)
        out[f"layer_{i}"] = n
    return out


def variant_bytes(units: list[int], hidden: int, layers: list[int], form: StoredForm, ratios: Ratios) -> dict[str, int]:
    """Bytes of a variant's units of ``units`` tokens each, by part (see ``unit_bytes``): what ``hsstore
    info`` reports as a variant's bytes."""
    total: dict[str, int] = {}
    for n in units:
        for part, b in unit_bytes(n, hidden, layers, form, ratios).items():
            total[part] = total.get(part, 0) + b
    return total


def files_per_unit(n_layers: int, quantized: bool) -> int:
    """Files a unit writes: its group metadata and two per array, plus its commit record."""
    return 1 + 2 * (2 + n_layers * (2 if quantized else 1)) + 1


def commit_bytes(samples: int, units: int, n_layers: int) -> int:
    """Bytes of the commit records of ``units`` units holding ``samples`` samples (not in a variant's bytes)."""
    return samples * COMMIT_BYTES_PER_SAMPLE + units * n_layers * COMMIT_BYTES_PER_LAYER


# --- Free space where a store lives: ``statvfs`` of the store's directory, or of its nearest existing parent


@dataclass(frozen=True)
class FreeSpace:
    """What the filesystem that will hold ``path`` has left for this user; ``block``: its allocation unit."""

    path: str  # the directory asked (the store, or its nearest existing parent)
    free_bytes: int
    block: int


def free_space(location: str) -> FreeSpace | None:
    """Free space for a store at ``location``; None where it is not known: an object store URL, or a
    filesystem that reports no blocks at all (``/proc``, ``/sys``: no store can be made there, and the
    store's own creation names that)."""
    if is_url(location):
        return None
    p = Path(location[len("file://") :] if location.startswith("file://") else location).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    if st.f_blocks == 0:
        return None
    return FreeSpace(str(p), st.f_bavail * st.f_frsize, st.f_frsize or 4096)


def file_size_limit() -> int | None:
    """This process's file-size limit (RLIMIT_FSIZE, ``ulimit -f``) in bytes; None when unlimited. A write past it
    fails (EFBIG) however much space is free."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)

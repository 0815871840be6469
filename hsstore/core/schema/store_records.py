"""The records a store holds: a variant's record, a unit's writer info and its commit record.

JSON stays byte-compatible with format 1.0 (tests/data/format-v1.zarr): field order is the order the
writer always used, optional fields that older records lack are ``UNSET`` and left out again. Beyond
types, each record refuses values that would make a reader go wrong (a negative offset, a file key
that leaves its unit, a non-positive size); where a record sits in the store is checked by storage.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Any, Literal

import msgspec

from hsstore.core.errors import CorruptData
from hsstore.core.schema.provenance import Provenance
from hsstore.core.schema.record import UNSET, Record, UnsetType

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
# a key inside a unit: "zarr.json", "layer_3/zarr.json", "layer_3/c/0/0" (no "..", no leading "/")
_REL_KEY = re.compile(r"^[0-9A-Za-z_][0-9A-Za-z_.-]*(/[0-9A-Za-z_][0-9A-Za-z_.-]*)*$")
_HEX = {"crc32c": re.compile(r"^[0-9a-f]{8}$"), "xxh3": re.compile(r"^[0-9a-f]{16}$")}
ChecksumKind = Literal["xxh3", "crc32c"]
ROLES = ("aux", "target")


class VariantRecord(Record, dict=True):
    """What every unit of one variant shares: provenance, layers by role, geometry and codec.

    ``provenance`` stays the plain dict the record was decoded from (the variant id hashes it, and its
    JSON bytes never change); readers use ``prov``, the same provenance decoded once as a typed record."""

    id: str
    provenance: dict[str, Any]  # the stored dict; read it through ``prov``
    layers: dict[str, list[NonNegative]]
    hidden_size: Positive
    dtype: str
    codec: str
    chunk_tokens: Positive
    precision: str | UnsetType = UNSET  # how states are stored when not as computed: "fp8-e4m3" (core.quant)

    def __post_init__(self) -> None:
        for path in (
            ("recipe",),
            ("environment",),
            ("recipe", "model"),
            ("recipe", "tokenizer"),
            ("recipe", "layers"),
            ("environment", "kernels"),
        ):  # the tables readers look into
            node: Any = self.provenance
            for i, name in enumerate(path):
                node = node.get(name) if isinstance(node, dict) else None
                if node is not None and not isinstance(node, dict):
                    raise ValueError(f"`provenance.{'.'.join(path[: i + 1])}` must be a table, got {node!r:.60}")
        fingerprint = self.provenance.get("recipe", {}).get("tokenizer", {}).get("fingerprint", "")
        if not isinstance(fingerprint, str):  # every sample key hashes it (hsstore.core.keys)
            raise ValueError(f"`provenance.recipe.tokenizer.fingerprint` must be a string, got {fingerprint!r:.60}")
        if sorted(self.layers) != sorted(ROLES):
            raise ValueError(f"`layers` must have the roles {list(ROLES)}, got {sorted(self.layers)}")
        if not self.layers["target"]:
            raise ValueError("`layers.target` is empty")

    @cached_property
    def prov(self) -> Provenance:
        """The provenance as a typed record (decoded on first use; CorruptData if it does not fit)."""
        return Provenance.from_dict(self.provenance, f"variant {self.id}: provenance", CorruptData)

    @property
    def all_layers(self) -> list[int]:
        return sorted({i for ids in self.layers.values() for i in ids})

    @property
    def stored_precision(self) -> str | None:
        """The precision the states are stored in when not as computed (e.g. "fp8-e4m3"), else None."""
        return self.precision if isinstance(self.precision, str) else None


class WriterInfo(Record):
    """Who wrote a unit: host and process (gc asks whether it still runs) and the writer id."""

    host: str
    pid: int
    writer: str


class UnitInfo(WriterInfo):
    """A unit's own metadata (``units/<uid>/zarr.json`` attributes ``hsstore_unit``): its writer and start."""

    started_at: str


class HealthStats(Record):
    """Additive per-layer statistics of a unit's states (hsstore.storage.stats)."""

    n: NonNegative
    sum: float
    sumsq: float
    absmax: float
    min: float
    max: float
    nan: NonNegative
    inf: NonNegative
    zeros: NonNegative


class QuantError(Record):
    """Additive storage error of one unit and layer of a quantized variant (hsstore.core.quant)."""

    tokens: NonNegative
    sum_sq_err: float
    sum_sq_ref: float
    cos_sum: float
    cos_min: float
    max_abs: float


class CommitRecord(Record):
    """One committed unit: which samples it holds where, its files with sizes and checksums, health stats."""

    unit: str
    samples: list[tuple[str, NonNegative, NonNegative]]  # (key, offset, length) in the unit's token arrays
    layers: list[NonNegative]
    files: dict[str, NonNegative]  # key relative to the unit -> size in bytes
    stats: dict[str, HealthStats]  # str(layer) -> additive stats
    writer: WriterInfo | UnsetType = UNSET
    committed_at: str | UnsetType = UNSET
    # key relative to the unit -> the file's checksum: xxh3 (64 bits, 16 hex digits) from 2026-12-07; crc32c (8 hex
    # digits) before, which tells apart no two files of one shard layout (each block ends with its own crc32c)
    xxh3: dict[str, str] | UnsetType = UNSET
    crc32c: dict[str, str] | UnsetType = UNSET
    variant: str | UnsetType = UNSET  # the variant it commits to (from 2026-12-07): a record copied to another is named
    quant_error: dict[str, QuantError] | UnsetType = UNSET  # str(layer) -> storage error (quantized variants)

    def __post_init__(self) -> None:
        for rel in self.files:
            if not _REL_KEY.match(rel) or ".." in rel.split("/"):
                raise ValueError(f"file key {rel!r} is not a path inside the unit")
        kind = self.checksum_kind
        for rel, value in self.checksums.items():
            if rel not in self.files or kind is None or not _HEX[kind].match(value):
                raise ValueError(f"{kind} of {rel!r} = {value!r} does not name a recorded file with its hex digits")

    @property
    def n_tokens(self) -> int:
        return sum(n for _, _, n in self.samples)

    @property
    def storage_errors(self) -> dict[str, dict[str, float]]:
        """str(layer) -> additive storage-error record ({} for variants stored as computed)."""
        return {k: v.to_dict() for k, v in self.quant_error.items()} if isinstance(self.quant_error, dict) else {}

    @property
    def checksum_kind(self) -> ChecksumKind | None:
        """Which checksum the record holds per file: xxh3, crc32c (records of before 2026-12-07), None (before
        2026-12-01: sizes only)."""
        return "xxh3" if isinstance(self.xxh3, dict) else "crc32c" if isinstance(self.crc32c, dict) else None

    @property
    def checksums(self) -> dict[str, str]:
        """The ``checksum_kind`` checksum per file ({} for records written before files had checksums)."""
        return self.xxh3 if isinstance(self.xxh3, dict) else self.crc32c if isinstance(self.crc32c, dict) else {}

    def coverage_problem(self) -> str | None:
        """Why the samples do not tile the token range ``[0, n_tokens)`` exactly, in order (None if they do)."""
        end = 0
        for key, off, n in self.samples:
            if off != end:
                return f"sample {key} starts at {off}, the previous one ends at {end}"
            if n == 0:
                return f"sample {key} is empty"
            end = off + n
        return None


LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # what a variant's label may be


class LabelRecord(Record):
    """One change of a variant's human label (``labels/<n>.json``, never replaced): the store's labels are
    these records replayed in order, so a label changes without rewriting a variant's data and every
    change stays in the store's history."""

    variant: str
    label: str
    previous: str | None  # the variant's label before (None: it had none)
    at: str  # UTC time, ISO 8601
    by: str  # the command that gave it, e.g. "build 20261205-…", "label", "convert", "import"

    def __post_init__(self) -> None:
        if not LABEL_PATTERN.match(self.label):
            raise CorruptData(f"label {self.label!r} is not a label (letters, digits, '_', '-', '.'; at most 64)")


class ModelRecord(Record):
    """A model let into a store that held another one (``models/<fingerprint>.json``, ``--another-model``):
    the store says it holds several models."""

    name: str
    fingerprint: str | None
    beside: list[str]  # the models the store held then
    at: str
    by: str


# --- Records about files a build reads: a stamp (what the filesystem says) and a content hash.


class FileStamp(Record):
    """Device, inode, size and the two timestamps: equal stamps before and after = the same file, untouched
    (a program can restore mtime but not ctime; hsstore still never trusts a stamp in place of a hash)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


class HashedFile(Record):
    """A file's size and xxh3_128 content hash, with the stamp it had while it was hashed."""

    size: int
    xxh3_128: str
    stamp: FileStamp


# --- zarr v3 array metadata (``zarr.json`` of an array), the part hsstore reads: typed, strictly decoded.


class ZarrCodec(msgspec.Struct, frozen=True):
    """One codec of a chain: its name and configuration."""

    name: str
    configuration: dict[str, Any] = {}


class ChunkGridConfig(msgspec.Struct, frozen=True):
    chunk_shape: list[int]


class ChunkGrid(msgspec.Struct, frozen=True):
    name: str
    configuration: ChunkGridConfig


class ShardingConfig(msgspec.Struct, frozen=True):
    """Configuration of the ``sharding_indexed`` codec: inner chunks, their chain, the index's chain."""

    chunk_shape: list[int]
    codecs: list[ZarrCodec]
    index_codecs: list[ZarrCodec]
    index_location: str = "end"


class ArrayMeta(msgspec.Struct, frozen=True):
    """An array's ``zarr.json``."""

    zarr_format: int
    node_type: str
    shape: list[int]
    data_type: str
    chunk_grid: ChunkGrid
    codecs: list[ZarrCodec]
    attributes: dict[str, Any] = {}


class GroupMeta(msgspec.Struct, frozen=True):
    """A group's ``zarr.json`` (hsstore's records live in its attributes)."""

    zarr_format: int
    node_type: str
    attributes: dict[str, Any] = {}

"""What ``hsstore info --json`` prints, as typed records: the store, and per variant its provenance, size,
compression, per-layer health, the fields that tell it apart, its storage precision and its audits.
Keys are stable (docs/json.md): fields are only ever added."""

from __future__ import annotations

from typing import Any

from hsstore.core.schema.record import UNSET, Record, UnsetType
from hsstore.core.schema.storage_report import StorageReport


class LayerHealth(Record):
    """One stored layer over every committed sample (recorded at write time)."""

    mean: float
    std: float
    absmax: float
    nan: int
    inf: int
    zero_fraction: float


class AuditSummary(Record, forbid_unknown_fields=False, kw_only=True):
    """What ``hsstore import --audit N`` found, kept in the store (``builds/audit-<time>.json``); the fields
    of ``hsstore check --json`` it keeps, None where the check had none. Fields a later hsstore adds are
    left out, not a reason to drop the audit."""

    kind: str  # "audit"
    audited_at: str
    model: str | None
    model_fingerprint: str | None
    samples: int | None
    population: int | None
    verdict: str | None
    verdict_kind: str | None
    defects: dict[str, int] | None
    defective_samples: int | None
    defect_rate_upper: int | float | None
    bound: str | None
    recompute: dict[str, Any] | None
    assumed: dict[str, str] | None
    restatement: dict[str, Any] | None = None  # an import's right --layers/--capture, when the audit found it wrong


class VariantInfo(Record):
    id: str
    provenance: dict[str, Any]  # as recorded: the document the variant id hashes
    n_samples: int
    n_tokens: int
    n_units: int
    bytes: int  # committed files on disk
    raw_state_bytes: int  # the states uncompressed, in the computed dtype
    compression_ratio: float | None  # raw_state_bytes / bytes (None: nothing on disk)
    codec: str
    dtype: str
    hidden_size: int
    layers: dict[str, list[int]]  # role -> stored layer ids
    health: dict[str, LayerHealth]  # stored layer -> health
    unreadable_commits: int
    precision: str | None  # None: stored as computed
    audits: list[AuditSummary]  # oldest first
    # the fewest fields that tell it from every other variant of the store, as selector keys
    # ({"token_budget": "1024"}); empty when it is the only variant (hsstore.core.distinguish)
    distinguished_by: dict[str, str] = {}
    storage: StorageReport | UnsetType = UNSET  # only for a variant stored in another precision
    label: str | None = None  # its human label (hsstore label), unique in the store
    selector: str = ""  # the shortest selector naming it alone: STORE#<selector> (label, fields or id)
    model: str = ""  # the model it is of: name (fingerprint prefix)


class ModelGroup(Record):
    """The variants of one model (a store holds one model unless --another-model let more in)."""

    model: str  # name (fingerprint prefix)
    fingerprint: str | None
    variants: list[str]


class StoreInfo(Record):
    format_version: str
    location: str
    variants: list[VariantInfo]
    models: list[ModelGroup] = []  # by model, in order of first variant; several only with --another-model

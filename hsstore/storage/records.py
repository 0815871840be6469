"""The JSON records a store holds (root, variant, commit), as frozen dataclasses with to/from dict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from hsstore.core.errors import CorruptData


def group_json(attributes: dict[str, Any]) -> bytes:
    """zarr v3 group metadata carrying ``attributes``, so any zarr reader opens the hierarchy."""
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes}, indent=1).encode()


def parse_json(data: bytes, what: str) -> Any:
    """JSON only (never pickle); a clear CorruptData naming ``what`` otherwise."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptData(f"{what} is not valid JSON ({e}); run `hsstore verify` and `hsstore gc`") from None


@dataclass(frozen=True)
class VariantRecord:
    """What every unit of one variant shares: provenance, layers by role, geometry and codec."""

    id: str
    provenance: dict[str, Any]
    layers: dict[str, list[int]]
    hidden_size: int
    dtype: str
    codec: str
    chunk_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VariantRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @property
    def all_layers(self) -> list[int]:
        return sorted({i for ids in self.layers.values() for i in ids})


@dataclass(frozen=True)
class CommitRecord:
    """One committed unit: which samples it holds where, its files and sizes, and health stats."""

    unit: str
    samples: list[tuple[str, int, int]]  # (key, offset, length) in the unit's token arrays
    layers: list[int]
    files: dict[str, int]  # key relative to the unit -> size in bytes
    stats: dict[str, dict[str, float]]  # str(layer) -> additive stats (hsstore.storage.stats)
    writer: dict[str, Any] = field(default_factory=dict)
    committed_at: str = ""
    crc32c: dict[str, str] = field(default_factory=dict)  # key relative to the unit -> crc32c (hex) of its bytes

    @property
    def n_tokens(self) -> int:
        return sum(n for _, _, n in self.samples)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = [list(s) for s in self.samples]
        if not self.crc32c:
            del d["crc32c"]  # (records written before files had checksums)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], what: str) -> CommitRecord:
        try:
            rec = cls(
                unit=str(d["unit"]),
                samples=[(str(k), int(o), int(n)) for k, o, n in d["samples"]],
                layers=[int(i) for i in d["layers"]],
                files={str(k): int(v) for k, v in d["files"].items()},
                stats={str(k): dict(v) for k, v in d["stats"].items()},
                writer=dict(d.get("writer", {})),
                committed_at=str(d.get("committed_at", "")),
                crc32c={str(k): str(v) for k, v in d.get("crc32c", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptData(f"{what} is not a valid commit record ({e!r}); run `hsstore verify`") from None
        return rec

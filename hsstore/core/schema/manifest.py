"""The build manifest: the TOML file's tables as typed records (the one place defaults live), and the
resolved ``Manifest`` a build runs from (paths made absolute, CLI overrides applied).

Types are checked here (``trust_remote_code = "false"`` is an error, not True); value rules (known
backends, dtypes, devices, codecs, ranges) are checked by ``hsstore.capture.inputs.manifest_file.validate``, which
knows the registries.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from hsstore.core.schema.record import Record

# the output of the model's final norm (what lm_head sees; transformers' last hidden_states entry): a named
# capture beside the decoder layers, stored under layer id num_layers
FINAL_NORM = "final_norm"
LayerId = int | Literal["final_norm"]
# overrides of a builtin model's config: scalars, or lists of them (e.g. layer_types)
ConfigValue = int | float | str | bool | list[int | float | str | bool]


class LayerSpec(Record):
    """``layers = { aux = [1, 2], target = [3] }`` as written (``"final_norm"`` allowed)."""

    target: list[LayerId]
    aux: list[LayerId] = []


class ModelTable(Record):
    path: str
    layers: LayerSpec
    config: dict[str, ConfigValue] = {}
    seed: int = 0
    trust_remote_code: bool = False
    init_device: str = "cpu"
    attn_implementation: str = "sdpa"


class DataTable(Record):
    files: list[str] | str
    format: str = "auto"
    max_length: int = 2048
    too_long: str = "truncate"


class BuildTable(Record):
    backends: list[str] = msgspec.field(default_factory=lambda: ["torch"])
    dtypes: list[str] = msgspec.field(default_factory=lambda: ["bf16"])
    devices: list[str] = msgspec.field(default_factory=lambda: ["cpu"])
    gpus_per_rank: int = 1  # >1: one model spread over that many GPUs
    token_budget: int = 16384
    unit_tokens: int | None = None  # None: as many tokens as make about 1 GiB of states
    allow_unhealthy: bool = False


class StoreTable(Record):
    path: str = ""
    codec: str = "shuffle-zstd"
    precision: str | None = None  # None: states stored as computed; "fp8-e4m3": quantized (hsstore.core.quant)


class ManifestFile(Record):
    """The TOML document: four tables, unknown tables and keys refused."""

    model: ModelTable
    data: DataTable
    build: BuildTable = BuildTable()
    store: StoreTable = StoreTable()


# table name -> its record (the allowed keys of each table are its fields)
TABLES: dict[str, type[Record]] = {"model": ModelTable, "data": DataTable, "build": BuildTable, "store": StoreTable}


class Manifest(Record):
    """A resolved manifest: absolute paths, one flat record the build reads (every value comes from a
    ``ManifestFile``, whose tables hold the defaults, or from a CLI override)."""

    source: str
    model_path: str
    layers: dict[str, list[LayerId]]  # {"aux": [...], "target": [...]} as written
    data_files: list[str]
    store_path: str
    config_overrides: dict[str, Any]
    seed: int
    trust_remote_code: bool
    init_device: str
    attn_implementation: str
    data_format: str
    max_length: int
    too_long: str
    backends: list[str]
    dtypes: list[str]
    devices: list[str]
    gpus_per_rank: int
    token_budget: int
    unit_tokens: int | None
    allow_unhealthy: bool
    codec: str
    precision: str | None = None

    def with_overrides(self, **changes: Any) -> Manifest:
        """CLI options override the manifest; None (or an empty list) means "not given"."""
        return self.replace(**{k: v for k, v in changes.items() if v is not None and v != []})

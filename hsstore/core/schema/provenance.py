"""Provenance: what a variant's states are (recipe) and how they were computed (environment).

Typed where present, required where readers depend on it: the sample key needs the tokenizer
fingerprint, reading needs the layers by role, matching needs dtype, backend, device and kernels. The
rest is optional so stores written by every 1.x hsstore (and the format-v1 fixture) decode; when a field
is present its type is checked. ``to_dict()`` returns exactly the dict the record was decoded from, so
variant ids (a hash of that dict, hsstore.core.provenance_match) never change by a round trip.
"""

from __future__ import annotations

from hsstore.core.schema.record import UNSET, Record, UnsetType
from hsstore.core.schema.imported import ImportSource


class WeightFile(Record):
    """One weight file of a local model directory: its size and content hash."""

    size: int
    xxh3_128: str


class ModelIdentity(Record):
    """What makes the weights these weights (``path`` and ``name`` are informational)."""

    name: str
    path: str | UnsetType = UNSET
    model_type: str | UnsetType = UNSET
    num_layers: int | UnsetType = UNSET
    hidden_size: int | UnsetType = UNSET
    config_fingerprint: str | UnsetType = UNSET
    fingerprint: str | UnsetType = UNSET
    # builtin random-init models
    seed: int | UnsetType = UNSET
    generator_version: int | UnsetType = UNSET
    init_device: str | UnsetType = UNSET
    # local model directories: file name -> size and content hash
    weights: dict[str, WeightFile] | UnsetType = UNSET


class TokenizerIdentity(Record):
    """The tokenizer's content fingerprint (its files and chat template); part of every sample key."""

    fingerprint: str
    vocab_size: int | UnsetType = UNSET
    has_chat_template: bool | UnsetType = UNSET
    # the day chat rows were rendered with, when the template prints today's date (hsstore.capture.inputs.chatdate);
    # absent for templates that print none, so their variant ids are what they were
    chat_date: str | UnsetType = UNSET


class LayerRoles(Record):
    """Layer ids by role: ``aux`` conditions the drafter, ``target`` is what it predicts."""

    aux: list[int]
    target: list[int]

    @property
    def all(self) -> list[int]:
        """Every stored layer id, ascending."""
        return sorted({*self.aux, *self.target})


class Recipe(Record):
    """What is computed: model, tokenizer, layers by role, capture point, length policy."""

    model: ModelIdentity
    tokenizer: TokenizerIdentity
    layers: LayerRoles
    capture: str | UnsetType = UNSET  # "decoder_layer_output": layer i = raw output of decoder layer i
    final_norm: bool | UnsetType = UNSET  # layer num_layers holds the final norm's output
    max_length: int | UnsetType = UNSET
    truncation: str | UnsetType = UNSET


class Kernels(Record):
    """The implementation really bound for each kernel family ('n/a' where the model has none)."""

    chunk_gated_delta_rule: str
    causal_conv1d: str
    attention: str


class Batching(Record):
    """How samples were batched for the forward pass (padding changes attention roundoff)."""

    padding_side: str
    token_budget: int
    attention_mask: bool
    order: str
    padded_lengths: str | UnsetType = UNSET  # how padded lengths are bucketed (hsstore.core.batching.POLICY)


class Stage(Record):
    """Decoder layers ``[first, last]`` placed on one GPU of a rank's group."""

    device: str
    layers: list[int]


class ModelParallel(Record):
    """Where a model spread over several GPUs ran (informational: each layer runs whole on one GPU)."""

    devices: list[str]
    stages: list[Stage]


class StorageSource(Record):
    """The variant a converted one was derived from (informational)."""

    variant: str
    store: str


class Storage(Record):
    """How the states are stored when not as computed (absent: stored as computed, bit-exact)."""

    precision: str  # e.g. "fp8-e4m3"
    scale: str  # the scaling scheme (hsstore.core.precision_names.SCALE_SCHEME)
    source: StorageSource | UnsetType = UNSET


class Environment(Record):
    """How the states were computed. ``device`` is the type; the index and host are informational."""

    device: str
    dtype: str
    backend: str
    kernels: Kernels
    device_index: int | UnsetType = UNSET
    device_name: str | UnsetType = UNSET
    compute_capability: str | UnsetType = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET
    flags: dict[str, bool | str] | UnsetType = UNSET
    batching: Batching | UnsetType = UNSET
    host: str | UnsetType = UNSET
    model_parallel: ModelParallel | UnsetType = UNSET
    storage: Storage | UnsetType = UNSET


class Provenance(Record):
    """A variant's provenance: ``{"recipe": ..., "environment": ...}`` (DESIGN §1, §3a)."""

    recipe: Recipe
    environment: Environment
    source: ImportSource | UnsetType = UNSET  # imported variants: where from, and what the user stated

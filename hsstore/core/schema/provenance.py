"""Provenance: what a variant's states are (recipe) and how they were computed (environment).

Typed where present, required where readers depend on it: the sample key needs the tokenizer
fingerprint, reading needs the layers by role, matching needs dtype, backend, device and kernels. The
rest is optional so stores written by every 1.x hsstore (and the format-v1 fixture) decode; when a field
is present its type is checked. ``to_dict()`` returns exactly the dict the record was decoded from, so
variant ids (a hash of that dict, hsstore.core.provenance_match) never change by a round trip.
"""

from __future__ import annotations

from typing import Any, Literal

from hsstore.core.schema.record import UNSET, Record, UnsetType

# --- Records of imported caches: the ``source`` block of an imported variant's provenance and the import

UNKNOWN = "unknown"  # a fact the source files do not record; never guessed


class ImportSource(Record):
    """Where an imported variant came from and what the user stated about it (``provenance.source``).

    ``layers`` are the ids of the files' state slots as stated (aux slots in file order, then the target),
    in the tool's numbering under ``capture``: ``output`` (id i = output of decoder layer i), ``input``
    (id i = state entering layer i = output of i-1, vLLM) or ``unknown``; ``final_norm`` = post-norm.
    ``claims`` are what the files say of themselves (Model-Optimizer's ``hidden_states_prenorm``).
    """

    tool: str
    format: str
    path: str
    layers: list[int | str]
    capture: Literal["output", "input", "unknown"]
    stated_by: Literal["user", "hsstore-export"]
    claims: dict[str, bool] = {}


class ImportEntry(Record):
    """One imported sample: the tool's item (path or row), its content key, and its files as
    ``[relative path, size, mtime_ns, xxh3_128]``."""

    item: str
    key: str
    files: list[tuple[str, int, int, str]]


class ImportChunk(Record):
    """The samples of one import step (written after their unit committed; ``unit`` None when every
    sample was already committed). ``context`` fingerprints files all samples share (speculators' Arrow
    table): a resumed import trusts these entries only while it is unchanged."""

    kind: Literal["import-chunk"]
    run: str
    seq: int
    format: str
    context: str
    unit: str | None
    entries: list[ImportEntry]
    created: str


class ImportDone(Record):
    """An import run that finished: counts, and fingerprints of the keys and of every file's hash."""

    kind: Literal["import"]
    complete: bool
    run: str
    tool: str
    format: str
    path: str
    n_items: int
    n_samples: int
    n_written: int
    n_present: int
    n_duplicates: int
    n_skipped_bad: int
    n_missing: int
    keys_fingerprint: str
    files_fingerprint: str
    finished_at: str


class ExportRecord(Record):
    """What ``hsstore export`` wrote (``hsstore-export.json`` in the folder; beside it for EAGLE): the
    variant and its provenance, and each state slot's layer in hsstore's ids and in the tool's numbering
    (``tool_capture``), so ``hsstore import`` of the folder needs no statement from the user."""

    kind: Literal["hsstore-export"]
    complete: bool
    format: str
    store: str
    variant: str
    provenance: dict[str, Any]
    num_layers: int
    slots: dict[str, list[int]]
    tool_layers: list[int | str]
    tool_capture: Literal["output", "input", "unknown"]
    n_samples: int
    files_fingerprint: str
    exported_at: str
    # files under the folder named as the layout names an export's, and their bytes, once complete: what a
    # re-export checks before it removes any (absent from records of earlier versions)
    folder_files: int | UnsetType = UNSET
    folder_bytes: int | UnsetType = UNSET
    folder_token: str | UnsetType = UNSET  # the folder's mark (interop.folder_mark), where it keeps one
    # a fingerprint of every other field, set once complete: an import restores ``provenance`` only while the
    # record is as written (a hand-edited record is ignored) and the files match ``files_fingerprint``
    seal: str | UnsetType = UNSET


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
    # the day chat rows were rendered with, when the template prints today's date (hsstore.capture.inputs.lossmask);
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


class Generation(Record):
    """How the replies of a regenerated variant were made (absent: the data's own replies were captured).
    Part of the recipe, so a variant of regenerated replies never matches one of the data's replies."""

    engine: str  # "model" (in process, transformers generate) or "openai" (a server)
    engine_version: str
    turns: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    n: int
    stop: list[str]
    chat_template_kwargs: dict[str, int | float | str | bool | list[int | float | str | bool]]
    reasoning: str
    # where the replies were made, as their checkpoints are keyed: "cpu/bf16" (engine "model": the build's first
    # device and dtype), the server's url (engine "openai"); absent in records made before either was kept
    generated_on: str | UnsetType = UNSET
    server: str | UnsetType = UNSET
    drop_cut: bool | UnsetType = UNSET  # true: replies cut at max_new_tokens were dropped (absent: kept)


class Recipe(Record):
    """What is computed: model, tokenizer, layers by role, capture point, length policy."""

    model: ModelIdentity
    tokenizer: TokenizerIdentity
    layers: LayerRoles
    capture: str | UnsetType = UNSET  # "decoder_layer_output": layer i = raw output of decoder layer i
    final_norm: bool | UnsetType = UNSET  # layer num_layers holds the final norm's output
    max_length: int | UnsetType = UNSET
    truncation: str | UnsetType = UNSET
    generation: Generation | UnsetType = UNSET  # the replies were regenerated by the target, and how


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

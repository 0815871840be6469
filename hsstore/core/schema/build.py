"""Records of a build: the plan the driver hands each worker, what a worker reports per variant, and the
summary ``hsstore build --json`` prints (its keys are stable: extended, never renamed)."""

from __future__ import annotations

from typing import Any

from hsstore.core.schema.base import UNSET, Record, UnsetType
from hsstore.core.schema.files import FileStamp
from hsstore.core.schema.provenance import Kernels, Recipe


class ModelSource(Record):
    """What ``[model]`` names: enough for a worker to load the model (hsstore.build.models.ModelSpec)."""

    path: str
    config_overrides: dict[str, Any] = {}
    seed: int = 0
    trust_remote_code: bool = False
    init_device: str = "cpu"


class WorkerPlan(Record):
    """Everything one worker process (one backend) runs from; written by the driver as JSON."""

    backend: str
    store: str
    recipe: Recipe
    model: ModelSource
    weight_stamps: dict[str, FileStamp]  # weight file -> its stamp when the driver hashed it (checked after load)
    samples_file: str  # this rank's tokenized samples (hsstore.build.samples_file)
    batches: list[list[int]]  # indices into the samples file, whole batches of the global plan
    runs: list[tuple[str, str]]  # (dtype, device): one variant each, in this order
    attn_implementation: str
    token_budget: int
    unit_tokens: int | None  # None: units of about UNIT_BYTES of states
    codec: str
    allow_unhealthy: bool
    pad_id: int
    writer_prefix: str  # "r<rank>-": names the rank that wrote a unit
    quiet: bool
    result: str  # where the worker writes its WorkerOutcome
    progress: str  # where the worker names each variant it opens, one id a line (read if the build stops early)
    parent_pid: int  # the driver: the worker exits when it is gone
    precision: str | None = None  # None: states stored as computed


class VariantResult(Record):
    """One variant a worker built (or found complete): counts and timings."""

    variant: str
    backend: str
    dtype: str
    device: str
    kernels: Kernels
    samples_written: int
    samples_present: int  # already committed before this build
    tokens: int
    bytes: int
    seconds: float
    loop_seconds: float
    tokens_per_second: float | None
    writer_busy_seconds: float
    first_batch_seconds: float | None
    tail_seconds: float | None
    pinned_alloc_seconds: float
    batch_shapes: int  # distinct padded (batch, length) shapes run: what kernels were compiled for
    steady_tokens: int  # tokens after the first batch ...
    steady_seconds: float  # ... and the time from its end to the last forward
    peak_gpu_memory_gb: dict[str, float]
    # CUDA only: the pinned host buffers reserved while the model loaded
    pinned_reserve_seconds: float | UnsetType = UNSET
    pinned_reserve_wait_seconds: float | UnsetType = UNSET
    pinned_reserve_bytes: int | UnsetType = UNSET
    pinned_reserve_error: str | None | UnsetType = UNSET


class WorkerOutcome(Record):
    """What a worker reports to its driver: its variants, or the error that stopped it."""

    results: list[VariantResult] = []
    error: str | None = None
    exit_code: int = 0


class InputCounts(Record):
    """What tokenizing the data files gave (hsstore.build.inputs.InputReport)."""

    rows: int
    usable: int
    truncated: int
    duplicates: int
    rejected: dict[str, int]  # reason -> rows
    issue_count: int | UnsetType = UNSET  # rejected + duplicate + truncated rows, each named in the rows report
    loss_mask: str | UnsetType = UNSET  # how chat loss masks were made (hsstore.build.lossmask.METHOD)


class BuildResult(Record):
    """The summary of one rank's build: what ``hsstore build --json`` prints."""

    store: str
    rank: int
    world_size: int
    inputs: InputCounts
    variants: list[VariantResult]
    complete: dict[str, bool] | None  # rank 0: variant -> every input sample committed
    seconds: float

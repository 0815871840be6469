"""Records of a build: the plan the driver hands each worker, what a worker reports per variant, the
summary ``hsstore build --json`` prints (its keys are stable: extended, never renamed), and the build
record each build leaves in the store (its lineage)."""

from __future__ import annotations

from typing import Any, Literal

from hsstore.core.schema.manifest import Manifest
from hsstore.core.schema.provenance import Kernels, Recipe
from hsstore.core.schema.record import UNSET, Record, UnsetType
from hsstore.core.schema.store_records import FileStamp


class ModelSource(Record):
    """What ``[model]`` names: enough for a worker to load the model (hsstore.capture.model.spec.ModelSpec)."""

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
    samples_file: str  # this rank's tokenized samples (hsstore.capture.inputs.datafiles)
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
    label: str | None = None  # the variant's label (a build of one variant)
    another_model: str | None = None  # set (the build id): this model may join a store of another


class CaptureResult(Record):
    """What one capture loop did (hsstore.capture.run.pipeline.capture_to_store): samples and bytes written,
    and where its time went."""

    samples_written: int
    bytes: int
    loop_seconds: float  # from the loop's start to the last unit written
    writer_busy_seconds: float  # the background writers' time in compression and I/O
    first_batch_seconds: float | None  # kernel JIT, autotuning, allocator growth (None: no batch ran)
    tail_seconds: float | None  # the last unit's copy and write after the last forward
    steady_tokens: int  # tokens after the first batch ...
    steady_seconds: float  # ... and the time from its end to the last forward
    batch_shapes: int  # distinct padded (batch, length) shapes run
    pinned_alloc_seconds: float  # allocating pinned host buffers (CUDA)


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
    # this build computed them, but another writer (a concurrent build of the store) committed them first
    samples_by_others: int = 0
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
    """What tokenizing the data files gave (hsstore.capture.inputs.tokenizing.InputReport)."""

    rows: int
    usable: int
    truncated: int
    duplicates: int
    rejected: dict[str, int]  # reason -> rows
    issue_count: int | UnsetType = UNSET  # rejected + duplicate + truncated rows, each named in the rows report
    loss_mask: str | UnsetType = UNSET  # how chat loss masks were made (hsstore.capture.inputs.lossmask.METHOD)
    replies_dropped: int | UnsetType = UNSET  # trained replies that truncation at max_length cut off whole
    empty_replies: int | UnsetType = UNSET  # kept rows with an empty trained reply (named in the rows report)


class BuildResult(Record):
    """The summary of one rank's build: what ``hsstore build --json`` prints."""

    store: str
    rank: int
    world_size: int
    inputs: InputCounts
    variants: list[VariantResult]
    complete: dict[str, bool] | None  # rank 0: variant -> every input sample committed
    seconds: float
    build_id: str
    build_record: str  # where this rank's record of the build is (store location + key)
    rows_report: str | None  # where every rejected, duplicate and truncated row is named (None: no such row)
    # [generate]: replies generated by this build and replies reused from earlier runs' checkpoints
    replies_generated: int | None = None
    replies_reused: int | None = None
    ledger: str | None = None  # where the ledger of the replies is (store location + key)
    # rank 0: variant -> its committed samples that are not among this build's inputs (earlier builds' of other
    # rows, of a larger --limit, or of rows changed since): a variant keeps every sample committed to it
    samples_not_in_inputs: dict[str, int] | None = None


class DataFile(Record):
    """A data file as the build read it: its size and content hash (a folder: its files' listing)."""

    path: str
    size: int
    xxh3_128: str  # a folder (save_to_disk): xxh3_128 of the canonical list of (relative path, size, hash)
    files: int = 1


class BuildRecord(Record, kw_only=True):
    """One rank's record of one build, kept in the store (``builds/<build_id>/``): written when the build
    starts (``outcome = "running"``) and again, under another key, when it ends — never replaced."""

    build_id: str  # "<UTC start>-<random>", shared by every rank of one torchrun build
    rank: int
    world_size: int
    outcome: Literal["running", "succeeded", "failed", "interrupted"]
    started_at: str
    finished_at: str | None = None
    error: str | None = None  # the one-line message of a failed or interrupted build
    host: str
    pid: int
    hsstore_version: str
    command: list[str]
    manifest: Manifest  # as resolved: absolute paths, CLI overrides applied
    data_files: list[DataFile]
    recipe: Recipe
    inputs: InputCounts
    samples: int  # usable samples of every rank
    share_samples: int  # this rank's share ...
    share_tokens: int  # ... and its tokens
    rows_report: str | None = None  # key of the JSON-lines report naming every rejected/duplicate/truncated row
    variants: list[VariantResult] = []  # what each worker reported (an ended build)
    committed: dict[str, int] = {}  # variant -> this rank's samples committed when the build ended
    complete: dict[str, bool] | None = None  # rank 0: every input sample committed, per variant


# --- Records about input rows: each row a build did not take as it was (rejected, duplicate, truncated).

RowIssueKind = Literal["rejected", "duplicate", "truncated", "empty_reply"]


class RowIssue(Record):
    """One named row: ``row`` is 1-based (the line of a .jsonl file, the element of a JSON list, the row of a
    parquet file or dataset folder). ``reason`` is the counted category; ``detail`` names the spot."""

    file: str
    row: int
    kind: RowIssueKind
    reason: str
    detail: str | UnsetType = UNSET

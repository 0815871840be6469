"""Records of ``hsstore plan``: what a build of a manifest will take (its keys are stable: extended, never
renamed; ``hsstore plan --json`` prints a ``PlanReport``)."""

from __future__ import annotations

from hsstore.core.schema.build import InputCounts
from hsstore.core.schema.record import Record


class Tokens(Record):
    """Samples and tokens after the build's filtering; sampled inputs give an interval."""

    samples: int
    tokens: int
    sampled_rows: int | None  # rows tokenized to estimate these (None: every row was)
    tokens_low: int | None  # the interval of ``tokens`` (None: counted, not estimated)
    tokens_high: int | None
    confidence: float | None  # of the interval (0.95)
    max_length: int
    mean_length: float


class Ratio(Record):
    """Raw / stored bytes of states with a codec, and where the figure comes from."""

    value: float
    source: str  # "measured: ..." on calibration batches, else the assumption's source
    measured: bool
    # the expected relative error of the bytes sized with this ratio (0.10: within ±10 %); None: unbounded
    # (no compression assumed for a codec that compresses: the bytes are an upper bound)
    expected_error: float | None = None


class VariantPlan(Record):
    """One variant the build will write: its size, what is committed already, and its time."""

    backend: str
    dtype: str  # computed in
    device: str
    form: str  # stored as: the dtype, or "fp8-e4m3"
    codec: str  # of its layer arrays
    samples: int
    tokens: int
    units: int
    bytes: int  # every unit file: what ``hsstore info`` reports for the variant
    bytes_per_layer: dict[str, int]  # layer id -> bytes (FP8: codes and scales)
    token_bytes: int  # input_ids, loss_mask and unit metadata
    ratio: Ratio
    committed_variant: str | None  # the store's variant of this recipe and environment, if any
    committed_samples: int
    committed_tokens: int
    remaining_bytes: int  # what the build still writes (bytes of what is not committed)
    flops: float  # executed by the forwards still to run
    seconds: float | None  # of those forwards (None: unknown; see seconds_source)
    seconds_source: str
    mfu: float | None  # measured or assumed (None: no peak known for the device)
    tokens_per_second: float | None


class FormSize(Record):
    """The whole sample set stored in one form with the manifest's codec: the choices side by side."""

    form: str
    codec: str
    bytes: int
    bytes_per_layer: dict[str, int]  # layer id -> bytes (FP8: codes and scales)
    ratio: Ratio


class Space(Record):
    """Free space where the store goes, against what the build still writes."""

    path: str
    local: bool  # False: an object store (free space not known: never checked)
    free_bytes: int | None
    needed_bytes: int  # remaining bytes of every variant, commit records, a block per file
    fits: bool | None  # (False also when the largest file exceeds the process's file-size limit)
    largest_file_bytes: int = 0  # the largest file the build still writes (a layer of its largest unit)
    file_size_limit: int | None = None  # this process's RLIMIT_FSIZE in bytes (None: unlimited)

    def limit_words(self) -> str | None:
        """Why the build's largest file cannot be written under the file-size limit, and the fix; None if it can."""
        from hsstore.core.outputs import byte_size

        if self.file_size_limit is None or self.largest_file_bytes <= self.file_size_limit:
            return None
        return (
            f"its largest file (~{byte_size(self.largest_file_bytes)}, a layer of a unit) exceeds this process's "
            f"file-size limit of {byte_size(self.file_size_limit)} ({self.file_size_limit:,} bytes, RLIMIT_FSIZE); "
            f"raise it (ulimit -f unlimited, or above {-(-self.largest_file_bytes // 1024)} KiB) or lower "
            "[store] unit_tokens"
        )


class GenerationPlan(Record):
    """What regenerating the replies ([generate]) takes: replies, generated tokens and time."""

    engine: str
    prompts: int  # rows that give a prompt
    replies: int  # replies to generate (turns x n per prompt)
    max_generated_tokens: int  # every reply cut at max_new_tokens
    expected_generated_tokens: int  # the data's own replies as long as the target's (capped at max_new_tokens)
    batches: int  # the in-process engine's batches (longest prompts first, within the token budget)
    # measured by --calibrate (engine = "model"): the build's first batch generated here twice, else None
    generated_tokens_per_second: float | None  # its second, warm generation
    first_batch_extra_seconds: float | None  # its first generation's one-off cost (the cold minus the warm time)
    calibration_prompts: int | None  # prompts in that batch
    seconds: float | None  # expected_generated_tokens at that rate, plus the one-off cost
    seconds_source: str
    checkpointed_replies: int = 0  # of ``replies``, held in the store by an earlier build (reused, not generated;
    # the generated tokens, batches and seconds are of the rest)


class PlanReport(Record):
    """What ``hsstore plan --json`` prints."""

    manifest: str
    store: str
    model: str
    hidden_size: int
    layers: list[int]  # every stored layer id
    inputs: InputCounts  # rows as read (of the sample when sampled)
    tokens: Tokens
    flops_per_token: float  # executed by the capture forward at the mean padded length
    variants: list[VariantPlan]
    forms: list[FormSize]
    space: Space
    batches: int  # the build's batches (of the tokenized rows: of the sample when sampled)
    calibration_batches: int  # run through the model per dtype (0: sizes and times rest on stated assumptions)
    generation: GenerationPlan | None = None  # [generate]: the replies are regenerated first

"""The ``hsstore diff --json`` and ``hsstore check --json`` reports as typed records.

The JSON keys are the documented, stable schema (docs/json.md): fields are only ever added.
Optional fields are ``UNSET`` (left out of the JSON) where they do not apply.
"""

from __future__ import annotations

from typing import Any

from hsstore.core.schema.record import UNSET, Record, UnsetType


class LayerDiff(Record):
    """One layer of A against B (B is the reference)."""

    layer: int
    tokens: int
    mean_abs: float
    max_abs: float
    rel_l2: float
    cos_mean: float
    cos_min: float
    cos_p01: float
    bit_exact: float
    ulp_distribution: dict[str, float] | UnsetType = UNSET  # both variants bf16
    floor_rel_l2: float | UnsetType = UNSET
    floor_ratio: float | UnsetType = UNSET
    verdict: str | UnsetType = UNSET
    roundoff_ratio: float | UnsetType = UNSET  # no floor: rel-L2 / the dtype's unit roundoff
    # sampled diffs: statistic -> [low, high] confidence interval (``bounds`` for maxima, see Sampling)
    ci: dict[str, tuple[float, float]] | UnsetType = UNSET


class WorstSample(Record):
    key: str
    rel_l2: float


class FieldDifference(Record):
    """A provenance field whose value differs between A, B (and the floor C)."""

    field: str
    a: Any
    b: Any
    c: Any = UNSET
    informational: bool = False  # cannot change a number (a path, a host, a tool version)


class Sampling(Record):
    """How a sampled diff chose its samples and computed its intervals."""

    method: str
    seed: int
    population: int  # shared samples
    samples: int  # compared
    fraction: float
    strata: int
    confidence: float
    interval: str
    notes: list[str]


class DiffReport(Record):
    a: str
    b: str
    shared_samples: int
    only_a: int
    only_b: int
    tokens: int
    loss_only: bool
    layers: list[LayerDiff]
    worst_samples: list[WorstSample]
    verdict: str
    # identical | within_noise | beyond_noise | no_floor (inconclusive: a sampled interval straddles the bound)
    verdict_kind: str = "no_floor"
    a_target: str = ""  # A, B and C as the user named them (STORE#SELECTOR)
    b_target: str = ""
    floor: str | UnsetType = UNSET
    floor_target: str | UnsetType = UNSET
    floor_layers: list[LayerDiff] | UnsetType = UNSET
    provenance_differences: list[FieldDifference] = []
    notes: list[str] = []  # what the reader must know: models allowed to differ, identities not recorded
    sampling: Sampling | UnsetType = UNSET
    seconds: float | UnsetType = UNSET


class Finding(Record):
    """One defect the audit names: its class, the sample, the stored layer (None: the whole sample) and
    the rows (token positions) it concerns."""

    kind: str  # hsstore.compare.defects.DEFECTS
    key: str
    layer: int | None
    detail: str
    rows: list[int] | UnsetType = UNSET  # up to MAX_ROWS of them
    n_rows: int | UnsetType = UNSET
    source: str | UnsetType = UNSET  # stale_copy: the sample the rows were copied from (itself: another block)
    # capture_point: the live capture point held (-1: the embeddings, entering layer 0); aux_equals_target: L when
    # it holds the final norm's output; token_shift: the shift k; suffix_states written from row 0: -k
    match: int | UnsetType = UNSET


class SampleVerdict(Record):
    """The audit's verdict on one checked sample: per stored layer its class."""

    key: str
    tokens: int
    verdict: str  # bit_exact | within_noise | the defect classes found, joined by "+"
    layers: dict[str, str]  # stored layer -> class
    floor_ratio: dict[str, float] = {}  # stored layer -> rel-L2 against the floor / the floor's noise


class Restatement(Record):
    """An imported variant's right ``--layers``/``--capture`` statement, found by the audit."""

    slots: list[int]  # the hsstore layer each file slot holds (aux slots in file order, then the target)
    stated: str  # the statement the import was made with
    flags: str  # the right one, in the tool's own numbering: "--layers 1,2,4 --capture input"
    words: str


class CheckReport(Record):
    """``hsstore check``: a live model's states of stored samples against the stored ones (A = live,
    B = stored, the reference), per layer."""

    model: str  # as given (a model directory, builtin:NAME or a build manifest)
    target: str  # STORE#SELECTOR as given
    variant: str  # STORE#VARIANT_ID
    device: str
    dtype: str
    model_fingerprint: str
    recorded_model_fingerprint: str
    same_model: bool
    samples: int
    tokens: int
    keys: list[str]
    batches: int  # recomputed batches (each chosen sample in its recorded batch)
    batching: str
    layers: list[LayerDiff]
    environment_differences: list[FieldDifference]
    verdict: str
    verdict_kind: str  # identical | within_noise | beyond_noise | differs
    notes: list[str] = []
    floor: str | UnsetType = UNSET
    floor_layers: list[LayerDiff] | UnsetType = UNSET
    seconds: float | UnsetType = UNSET
    # the audit (hsstore.compare.audit): how it recomputed, what it assumed, what it named, what n bounds
    recompute: dict[str, Any] | UnsetType = UNSET
    assumed: dict[str, str] = {}
    population: int | UnsetType = UNSET
    sample_verdicts: list[SampleVerdict] = []
    findings: list[Finding] = []
    defects: dict[str, int] = {}  # class -> number of samples with it
    defective_samples: int | UnsetType = UNSET
    defect_rate_upper: float | None | UnsetType = UNSET  # None: samples named by the user bound no rate
    bound: str | UnsetType = UNSET
    restatement: Restatement | UnsetType = UNSET  # an import whose slots hold other layers than stated
    tokenizer_fingerprint: str | UnsetType = UNSET  # the model's tokenizer (unset: the model has none to load)
    recorded_tokenizer_fingerprint: str | UnsetType = UNSET  # the variant's (its sample keys hash it)
    same_tokenizer: bool | UnsetType = UNSET


class AlignLayer(Record):
    """What one of A's layers holds: its best match among B's layers, and what that means."""

    layer: int  # A's label
    match: int  # B's layer id (hsstore id: output of decoder layer j; num_layers = final norm)
    rel_l2: float
    cos_mean: float
    runner_up: int | None
    runner_up_rel_l2: float
    relation: str  # as_labelled | off_by_one | pre_norm | post_norm | shifted | no_match
    message: str
    rel_l2_by_b_layer: dict[str, float]


class AlignReport(Record):
    """``hsstore diff A B --align``: each of A's layers matched against B's capture points."""

    a: str
    b: str
    a_target: str
    b_target: str
    a_capture: str  # A's recipe.capture as recorded ("unknown" for a cache whose convention was not stated)
    samples: int
    tokens: int
    b_layers: list[int]
    b_points: dict[str, str]  # B's layer id -> the capture point it is, in words
    layers: list[AlignLayer]
    summary: str
    ok: bool  # every layer of A is what its label says
    notes: list[str] = []

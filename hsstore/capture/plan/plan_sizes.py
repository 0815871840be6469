"""Sizes of the variants a manifest builds, from its tokenized samples and the build's own batch plan:
bytes per variant and layer, what the store has already committed, and the space the build still needs.
Shared by ``hsstore plan`` and the space check ``hsstore build`` runs before any model loads."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hsstore.capture.inputs.datafiles import load_rows
from hsstore.core.batching import default_unit_tokens, padded_length, unit_sizes
from hsstore.core.errors import BadInput
from hsstore.core.flops import sample_indices, total_from_sample
from hsstore.core.outputs import byte_size
from hsstore.core.provenance_match import numeric_fields
from hsstore.core.schema.build import InputCounts
from hsstore.core.schema.plan import Space, Tokens
from hsstore.storage.sizing import (
    Ratios,
    StoredForm,
    assumed_error,
    assumed_ratio,
    commit_bytes,
    files_per_unit,
    unit_bytes,
    variant_bytes,
)

# --- What a store already holds of a planned build: for each (backend, dtype, device, precision) the variant

# environment fields a plan cannot know before a model is loaded (or that name this host)
_UNKNOWABLE = (
    "environment.kernels.chunk_gated_delta_rule",
    "environment.kernels.causal_conv1d",
    "environment.device_name",
    "environment.device_index",
    "environment.compute_capability",
    "environment.model_parallel",
)


@dataclass(frozen=True)
class Committed:
    """The store's variant for one planned run and its committed share of the planned samples."""

    variant: str | None
    keys: frozenset[str]  # the planned samples it has committed

    @property
    def samples(self) -> int:
        return len(self.keys)


def _key(provenance: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in numeric_fields(provenance).items() if not k.startswith(_UNKNOWABLE)}


NOTHING = Committed(None, frozenset())


def committed(store_path: str, expected: list[dict[str, Any]], keys: Collection[str]) -> list[Committed]:
    """For each ``expected`` provenance (kernels left as planned), the store variant whose knowable fields
    match and which of the planned ``keys`` it has committed (the variant with most of them). A store that
    does not exist yet holds nothing."""
    from pathlib import Path

    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.store import Store, check_not_nested

    try:
        store = Store.open(store_path)
    except StoreNotFound:
        if "://" not in store_path:
            check_not_nested(Path(store_path))  # what the build would refuse, the plan refuses
        return [NOTHING for _ in expected]
    fields = {vid: _key(store.variant_record(vid).provenance) for vid in store.variant_ids()}
    out = []
    for prov in expected:
        want = _key(prov)
        best = NOTHING
        for vid in sorted(v for v, k in fields.items() if k == want):
            refs = store.reader(vid).refs
            done = frozenset(k for k in keys if k in refs)
            if best.variant is None or len(done) > best.samples:
                best = Committed(vid, done)
        out.append(best)
    return out


@dataclass(frozen=True)
class StoreRatio:
    """Codec ratios measured on a store variant's committed files (same model, width, stored form, codec)."""

    variant: str
    tokens: int
    ratios: Any  # hsstore.storage.sizing.Ratios


def store_ratios(store_path: str, model_fingerprint: Any, hidden: int) -> dict[tuple[str, str], StoreRatio]:
    """(stored form, codec) -> the ratios the store's variants of this model and width reach on disk (the
    variant with most tokens per form): each layer's committed bytes, less the metadata, chunk and shard
    overheads the sizing adds itself, against its raw bytes. Nothing for a store that does not exist."""
    from hsstore.core.errors import StoreNotFound
    from hsstore.storage.store import Store

    try:
        store = Store.open(store_path)
    except StoreNotFound:
        return {}
    out: dict[tuple[str, str], StoreRatio] = {}
    for vid in store.variant_ids():
        rec = store.variant_record(vid)
        if (
            rec.hidden_size != hidden
            or rec.provenance.get("recipe", {}).get("model", {}).get("fingerprint") != model_fingerprint
            or model_fingerprint in (None, "unknown")
        ):
            continue
        found = _measured(store, vid, rec)
        if found is not None and found.tokens > out.get(found_key(rec), StoreRatio("", 0, None)).tokens:
            out[found_key(rec)] = found
    return out


def found_key(rec: Any) -> tuple[str, str]:
    """A variant record's (stored form, codec): what a planned run is matched on."""
    return (rec.stored_precision or rec.dtype, rec.codec)


def _measured(store: Any, vid: str, rec: Any) -> StoreRatio | None:
    """The variant's ratios per layer (FP8: its codes; scales apart) from its commit records' file sizes."""
    from hsstore.storage.sizing import Ratios, StoredForm, array_overhead

    form = StoredForm.of(rec.dtype, rec.stored_precision, rec.codec)
    if form.codec == "none":
        return None
    raw: dict[int, float] = {}
    stored: dict[int, float] = {}
    scale_raw = scale_stored = 0.0
    tokens = 0
    for c in store.commits(vid)[0]:
        n = c.n_tokens
        tokens += n
        for i in c.layers:
            size = {
                p: sum(b for rel, b in c.files.items() if rel.split("/")[0] == f"{p}_{i}") for p in ("layer", "scale")
            }
            over = array_overhead(n, rec.hidden_size, form)
            raw[i] = raw.get(i, 0) + n * rec.hidden_size * form.itemsize
            stored[i] = stored.get(i, 0) + max(1, size["layer"] - over[0])
            if form.quantized:
                scale_raw, scale_stored = scale_raw + 4 * n, scale_stored + max(1, size["scale"] - over[1])
    if not tokens or not raw:
        return None
    layers = {i: raw[i] / stored[i] for i in raw}
    return StoreRatio(
        vid,
        tokens,
        Ratios(sum(raw.values()) / sum(stored.values()), layers, scale_raw / scale_stored if scale_stored else 1.0),
    )


@dataclass(frozen=True)
class Run:
    """One variant the build writes."""

    backend: str
    dtype: str
    device: str
    precision: str | None


@dataclass(frozen=True)
class VariantSize:
    """One variant's planned size: by part, with the ratio it rests on, its committed share and remainder."""

    run: Run
    form: StoredForm
    units: int
    parts: dict[str, int]  # "tokens" / "layer_<i>" -> bytes (scaled to the whole data when sampled)
    ratio: float
    ratio_source: str
    measured: bool
    ratio_error: float | None  # the expected relative error of the bytes the ratio gives (None: unbounded)
    committed: Committed
    committed_tokens: int  # of the tokenized samples (unscaled)
    remaining_bytes: int
    remaining_batches: list[list[int]]  # batches with a sample not committed: what the build still runs
    largest_file: int = 0  # bytes of the largest file still to write (a layer of the largest unit left)

    @property
    def bytes(self) -> int:
        """Every unit file of the variant: what ``hsstore info`` reports."""
        return sum(self.parts.values())


def runs(m: Any) -> list[Run]:
    """Every variant of the manifest, in the order the build writes them."""
    return [Run(b, d, dev, m.precision) for b in m.backends for d in m.dtypes for dev in m.devices]


def batch_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> list[int]:
    """Tokens of each batch (indices into ``lengths``)."""
    return [sum(lengths[i] for i in b) for b in batches]


def batch_shapes(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(rows, padded width) of each batch, as the capture pads them."""
    return [(len(b), padded_length(max(lengths[i] for i in b))) for b in batches if b]


@dataclass(frozen=True)
class Measured:
    """Codec ratios measured for a run, where, and the expected relative error of the bytes they give."""

    ratios: Ratios
    source: str
    error: float


def size_variant(
    m: Any,
    run: Run,
    lengths: list[int],
    keys: list[str],
    batches: list[list[int]],
    geometry: tuple[int, list[int]],
    committed: Committed,
    found: Measured | None,
    scale: float = 1.0,
) -> VariantSize:
    """``run``'s bytes over the samples (``lengths``, ``keys``) cut into units as the build cuts them;
    ``found``: measured ratios, or None to assume; ``scale``: sampled tokens -> all tokens."""
    hidden, layers = geometry
    form = StoredForm.of(run.dtype, run.precision, m.codec)
    if found is None:
        value, source = assumed_ratio(form.form, form.codec)
        ratios, measured, error = Ratios(value), False, assumed_error(form.form, form.codec)
    else:
        ratios, value, source, measured, error = found.ratios, found.ratios.default, found.source, True, found.error
    if form.codec == "none":
        value, source, error = 1.0, "no codec", 0.01
    unit_tokens = m.unit_tokens or default_unit_tokens(hidden, form.itemsize, len(layers))
    units = unit_sizes(batch_tokens(lengths, batches), unit_tokens)
    parts = {k: int(v * scale) for k, v in variant_bytes(units, hidden, layers, form, ratios).items()}
    done = committed.keys
    left = [b for b in batches if any(keys[i] not in done for i in b)]
    left_units = unit_sizes([sum(lengths[i] for i in b if keys[i] not in done) for b in left], unit_tokens)
    remaining = int(sum(variant_bytes(left_units, hidden, layers, form, ratios).values()) * scale) if left_units else 0
    tokens_done = sum(n for n, k in zip(lengths, keys) if k in done)
    largest = max(unit_bytes(max(left_units), hidden, layers, form, ratios).values()) if left_units else 0
    return VariantSize(
        run, form, len(units), parts, value, source, measured, error, committed, tokens_done, remaining, left, largest
    )


def needed_bytes(sizes: list[VariantSize], samples: int, block: int) -> int:
    """What the build still writes to disk (``samples``: of the whole data): the remaining bytes of every
    variant, their commit records and, per file, up to one allocation block of rounding."""
    total = 0
    for v in sizes:
        if not v.remaining_bytes:
            continue
        n_layers = sum(1 for k in v.parts if k.startswith("layer_"))
        share = v.remaining_bytes / max(1, v.bytes)
        units = max(1, round(v.units * share))
        total += v.remaining_bytes + commit_bytes(round(samples * share), units, n_layers)
        total += units * files_per_unit(n_layers, v.form.quantized) * block
    return total


# --- ``hsstore plan``: what a build of a manifest will take before it runs — samples and tokens after the

SAMPLE_SEED = 0


def sampled_rows(files: list[str], n: int, seed: int = SAMPLE_SEED) -> tuple[list[tuple[str, int, Any]], int]:
    """``n`` rows of the data files drawn with ``seed`` (two passes: count, then pick) and how many there are."""
    total = sum(1 for _ in load_rows(files))
    want = set(sample_indices(total, n, seed))
    return [r for k, r in enumerate(load_rows(files)) if k in want], total


def tokens_of(inp: Any, population: int | None, per_row: int = 1) -> tuple[Tokens, float]:
    """The samples and tokens the build keeps (an interval when ``population`` rows were sampled), and
    the factor that scales the sample's sizes to the whole data. ``per_row``: the samples a row gives
    (a regenerating build's ``n``: a row's n samples are consecutive and kept or refused together)."""
    lengths = [s.length for s in inp.samples]
    tokens = sum(lengths)
    mean = tokens / max(1, len(lengths))
    if population is None or population <= inp.report.rows:
        return Tokens(
            samples=len(lengths),
            tokens=tokens,
            sampled_rows=None,
            tokens_low=None,
            tokens_high=None,
            confidence=None,
            max_length=max(lengths),
            mean_length=mean,
        ), 1.0
    rows_kept = [sum(lengths[i : i + per_row]) for i in range(0, len(lengths), per_row)]
    row_tokens = rows_kept + [0] * (inp.report.rows - len(rows_kept))  # rejected and duplicate rows keep nothing
    t = total_from_sample(row_tokens, population)
    kept = round(population * len(lengths) / inp.report.rows)
    return Tokens(
        samples=kept,
        tokens=round(t.estimate),
        sampled_rows=inp.report.rows,
        tokens_low=round(t.low),
        tokens_high=round(t.high),
        confidence=t.confidence,
        max_length=max(lengths),
        mean_length=mean,
    ), t.estimate / max(1, tokens)


def expected_provenances(m: Any, inp: Any) -> list[dict[str, Any]]:
    """The provenance each run's variant will have, the kernels a loaded model binds unknown but for the
    attention asked for; the device by its type (no CUDA context is made in a build's driver)."""
    from hsstore.capture.run.worker import planned_provenance
    from hsstore.core.schema.provenance import Kernels

    unknown = Kernels(chunk_gated_delta_rule="?", causal_conv1d="?", attention=m.attn_implementation)
    return [
        planned_provenance(
            inp.recipe, m.token_budget, r.precision, r.backend, r.dtype, r.device, unknown, probe=False
        ).to_dict()
        for r in runs(m)
    ]


# bytes sized with a store variant's measured ratios, against the build (tests/capture/test_plan_report.py): within 10 % when
# the variant holds at least half the planned tokens; a smaller sample of the data compresses otherwise (the
# tiny model's 12 samples reached 2.30x where its 40 reach 1.91x: 16 % off)
STORE_ERROR, STORE_SMALL_ERROR = 0.10, 0.25


def on_disk(m: Any, inp: Any) -> dict[tuple[str, str], Measured]:
    """(stored form, codec) -> ratios the store's variants of this model reach on disk (nothing to load)."""

    planned = sum(s.length for s in inp.samples)
    found = store_ratios(m.store_path, inp.recipe.model.fingerprint, int(inp.recipe.model.hidden_size))
    return {
        k: Measured(
            r.ratios,
            f"measured on the {r.tokens:,} committed tokens of variant {r.variant} in the store",
            STORE_ERROR if 2 * r.tokens >= planned else STORE_SMALL_ERROR,
        )
        for k, r in found.items()
    }


def sizes(
    m: Any,
    inp: Any,
    calibrated: dict[str, dict[str, Measured]] | None = None,
    scale: float = 1.0,
    probed: dict[str, dict[str, Measured]] | None = None,
) -> list[VariantSize]:
    """Every run's size, its ratios (dtype -> form -> Measured): ``calibrated`` if given, else the one of
    smaller expected error of the store's variants of the same model and stored form and ``probed``; else
    assumed."""
    from hsstore.core.batching import token_budget_batches
    from hsstore.storage.sizing import StoredForm

    lengths = [s.length for s in inp.samples]
    keys = [s.key for s in inp.samples]
    batches = token_budget_batches(lengths, m.token_budget)
    expected = expected_provenances(m, inp)
    done = committed(m.store_path, expected, keys)
    geometry = (int(inp.recipe.model.hidden_size), inp.recipe.layers.all)
    stored = on_disk(m, inp)
    out = []
    for k, run in enumerate(runs(m)):
        form = run.precision or run.dtype
        others = [
            x
            for x in (
                stored.get((form, StoredForm.of(run.dtype, run.precision, m.codec).codec)),
                (probed or {}).get(run.dtype, {}).get(form),
            )
            if x is not None
        ]
        found = (calibrated or {}).get(run.dtype, {}).get(form) or min(others, key=lambda x: x.error, default=None)
        out.append(size_variant(m, run, lengths, keys, batches, geometry, done[k], found, scale))
    return out


def space(m: Any, found: list[VariantSize], samples: int) -> Space:
    """Free space at the store's place against what the build still writes (never known for object stores),
    and the largest file it writes against this process's file-size limit (RLIMIT_FSIZE: local files only)."""
    from hsstore.storage.sizing import file_size_limit, free_space

    free = free_space(m.store_path)
    largest = max((v.largest_file for v in found), default=0)
    if free is None:
        return Space(
            path=m.store_path,
            local=False,
            free_bytes=None,
            needed_bytes=needed_bytes(found, samples, 0),
            fits=None,
            largest_file_bytes=largest,
        )
    need, limit = needed_bytes(found, samples, free.block), file_size_limit()
    return Space(
        path=free.path,
        local=True,
        free_bytes=free.free_bytes,
        needed_bytes=need,
        fits=need <= free.free_bytes and (limit is None or largest <= limit),
        largest_file_bytes=largest,
        file_size_limit=limit,
    )


def check_space(m: Any, inp: Any) -> None:
    """BadInput (exit 2) when the filesystem under a local store cannot hold what the build still writes
    at the assumed codec ratios; object stores are not checked (their free space is not known)."""
    found = sizes(m, inp)
    s = space(m, found, len(inp.samples))
    if (words := s.limit_words()) is not None:
        raise BadInput(f"store {m.store_path!r}: the build cannot write {words}; or pass --no-space-check")
    if s.fits is False:
        ratio = ", ".join(sorted({f"{v.form.form}/{v.form.codec} {v.ratio:.2f}x" for v in found}))
        raise BadInput(
            f"store {m.store_path!r}: the build needs ~{byte_size(s.needed_bytes)} ({len(found)} "
            f"variant(s), {sum(x.length for x in inp.samples):,} tokens, assumed codec ratio {ratio}) "
            f"but {s.path} has {byte_size(s.free_bytes)} free; free space, choose another --store, "
            "or pass --no-space-check (local stores only; see hsstore plan MANIFEST)"
        )


def counts(inp: Any) -> InputCounts:
    """The input report as the build reports it."""
    return InputCounts.from_dict(inp.report.to_dict(), "input report", BadInput)

"""``hsstore plan``: what a build of a manifest will take before it runs — samples and tokens after the
build's own filtering, bytes per variant and layer, what the store already holds, free space, and the
forward's FLOPs and time — and the space check ``hsstore build`` runs before any model loads.

Sizes follow the build's own batch and unit plan (hsstore.capture.plan.plan_sizes); codec ratios and tokens/s
are measured on N batches of that plan with ``calibrate`` (hsstore.capture.plan.calibrate), else the stated
assumptions of hsstore.storage.sizing and hsstore.core.flops are used.
"""

from __future__ import annotations

from typing import Any

from hsstore.capture.inputs.datafiles import load_rows
from hsstore.capture.plan.plan_sizes import Measured, VariantSize, needed_bytes, runs, size_variant
from hsstore.core.errors import BadInput
from hsstore.core.extrapolate import sample_indices, total_from_sample
from hsstore.core.humanize import byte_size
from hsstore.core.schema.build import InputCounts
from hsstore.core.schema.plan import Space, Tokens

SAMPLE_SEED = 0


def sampled_rows(files: list[str], n: int, seed: int = SAMPLE_SEED) -> tuple[list[tuple[str, int, Any]], int]:
    """``n`` rows of the data files drawn with ``seed`` (two passes: count, then pick) and how many there are."""
    total = sum(1 for _ in load_rows(files))
    want = set(sample_indices(total, n, seed))
    return [r for k, r in enumerate(load_rows(files)) if k in want], total


def tokens_of(inp: Any, population: int | None) -> tuple[Tokens, float]:
    """The samples and tokens the build keeps (an interval when ``population`` rows were sampled), and
    the factor that scales the sample's sizes to the whole data."""
    lengths = [s.length for s in inp.samples]
    tokens = sum(lengths)
    mean = tokens / max(1, len(lengths))
    if population is None or population <= inp.report.rows:
        return Tokens(samples=len(lengths), tokens=tokens, sampled_rows=None, tokens_low=None, tokens_high=None,
                      confidence=None, max_length=max(lengths), mean_length=mean), 1.0
    per_row = lengths + [0] * (inp.report.rows - len(lengths))  # rejected and duplicate rows keep nothing
    t = total_from_sample(per_row, population)
    kept = round(population * len(lengths) / inp.report.rows)
    return Tokens(samples=kept, tokens=round(t.estimate), sampled_rows=inp.report.rows, tokens_low=round(t.low),
                  tokens_high=round(t.high), confidence=t.confidence, max_length=max(lengths),
                  mean_length=mean), t.estimate / max(1, tokens)


def expected_provenances(m: Any, inp: Any) -> list[dict[str, Any]]:
    """The provenance each run's variant will have, the kernels a loaded model binds unknown but for the
    attention asked for; the device by its type (no CUDA context is made in a build's driver)."""
    from hsstore.capture.run.worker import planned_provenance
    from hsstore.core.schema.provenance import Kernels

    unknown = Kernels(chunk_gated_delta_rule="?", causal_conv1d="?", attention=m.attn_implementation)
    return [planned_provenance(inp.recipe, m.token_budget, r.precision, r.backend, r.dtype, r.device, unknown,
                               probe=False).to_dict() for r in runs(m)]


# bytes sized with a store variant's measured ratios, against the build (tests/test_plan.py): within 10 % when
# the variant holds at least half the planned tokens; a smaller sample of the data compresses otherwise (the
# tiny model's 12 samples reached 2.30x where its 40 reach 1.91x: 16 % off)
STORE_ERROR, STORE_SMALL_ERROR = 0.10, 0.25


def on_disk(m: Any, inp: Any) -> dict[tuple[str, str], Measured]:
    """(stored form, codec) -> ratios the store's variants of this model reach on disk (nothing to load)."""
    from hsstore.capture.plan.plan_store import store_ratios

    planned = sum(s.length for s in inp.samples)
    found = store_ratios(m.store_path, inp.recipe.model.fingerprint, int(inp.recipe.model.hidden_size))
    return {k: Measured(r.ratios, f"measured on the {r.tokens:,} committed tokens of variant {r.variant} in the "
                                  "store", STORE_ERROR if 2 * r.tokens >= planned else STORE_SMALL_ERROR)
            for k, r in found.items()}


def sizes(m: Any, inp: Any, calibrated: dict[str, dict[str, Measured]] | None = None, scale: float = 1.0,
          probed: dict[str, dict[str, Measured]] | None = None) -> list[VariantSize]:
    """Every run's size, its ratios (dtype -> form -> Measured): ``calibrated`` if given, else the one of
    smaller expected error of the store's variants of the same model and stored form and ``probed``; else
    assumed."""
    from hsstore.capture.plan.plan_store import committed
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
        others = [x for x in (stored.get((form, StoredForm.of(run.dtype, run.precision, m.codec).codec)),
                              (probed or {}).get(run.dtype, {}).get(form)) if x is not None]
        found = (calibrated or {}).get(run.dtype, {}).get(form) or min(others, key=lambda x: x.error, default=None)
        out.append(size_variant(m, run, lengths, keys, batches, geometry, done[k], found, scale))
    return out


def space(m: Any, found: list[VariantSize], samples: int) -> Space:
    """Free space at the store's place against what the build still writes (never known for object stores),
    and the largest file it writes against this process's file-size limit (RLIMIT_FSIZE: local files only)."""
    from hsstore.storage.space import file_size_limit, free_space

    free = free_space(m.store_path)
    largest = max((v.largest_file for v in found), default=0)
    if free is None:
        return Space(path=m.store_path, local=False, free_bytes=None,
                     needed_bytes=needed_bytes(found, samples, 0), fits=None, largest_file_bytes=largest)
    need, limit = needed_bytes(found, samples, free.block), file_size_limit()
    return Space(path=free.path, local=True, free_bytes=free.free_bytes, needed_bytes=need,
                 fits=need <= free.free_bytes and (limit is None or largest <= limit), largest_file_bytes=largest,
                 file_size_limit=limit)


def check_space(m: Any, inp: Any) -> None:
    """BadInput (exit 2) when the filesystem under a local store cannot hold what the build still writes
    at the assumed codec ratios; object stores are not checked (their free space is not known)."""
    found = sizes(m, inp)
    s = space(m, found, len(inp.samples))
    if (words := s.limit_words()) is not None:
        raise BadInput(f"store {m.store_path!r}: the build cannot write {words}; or pass --no-space-check")
    if s.fits is False:
        ratio = ", ".join(sorted({f"{v.form.form}/{v.form.codec} {v.ratio:.2f}x" for v in found}))
        raise BadInput(f"store {m.store_path!r}: the build needs ~{byte_size(s.needed_bytes)} ({len(found)} "
                       f"variant(s), {sum(x.length for x in inp.samples):,} tokens, assumed codec ratio {ratio}) "
                       f"but {s.path} has {byte_size(s.free_bytes)} free; free space, choose another --store, "
                       "or pass --no-space-check (local stores only; see hsstore plan MANIFEST)")


def counts(inp: Any) -> InputCounts:
    """The input report as the build reports it."""
    return InputCounts.from_dict(inp.report.to_dict(), "input report", BadInput)

"""``hsstore check`` as an audit: any variant — native, imported from another tool, written by an engine —
recomputed with a model and judged per sample and per layer by the defect classifier.

Taken when the variant's provenance leaves how it was computed unknown (an import), or when asked for
(``--floor live``, ``--backend``/``--dtype``/``--attn``/``--token-budget``/``--fraction``). It:
1. resolves how to recompute (``hsstore.compare.audit``: recorded, else the user's options, else defaults,
   every assumption named in the report);
2. chooses a seeded, length-stratified set of samples (``hsstore.compare.sampling``) and refuses (exit 2),
   before any model runs, a model that cannot produce the stored shapes (hidden size, layer count, vocabulary);
3. recomputes each chosen sample (alone, or in the recorded or a token-budget batch plan) capturing every
   decoder layer's output and the final norm's, at the recompute dtype and — the live floor — in fp32
   (fp64 for an fp32 variant), so "within precision noise" has a meaning for a cache that came with no
   floor; a stored ``--floor STORE#SEL`` serves instead where it holds the sample;
4. classifies (``hsstore.compare.defects``; rows that are another sample's: ``hsstore.compare.stale``) and says
   what the n checked samples bound (``hsstore.compare.sampling``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hsstore.capture.run.hooks import EMBEDDINGS
from hsstore.compare.check import BatchPlan, as_stored, batch_plan, check_shapes, live_states, model_spec, pad_id
from hsstore.compare.defects import CLEAN, DEFECTS, LayerEvidence, apply, judge_sample, other_weights, sample_evidence
from hsstore.compare.diff import NOISE_FACTOR, check_device, open_target, use_compiled
from hsstore.compare.kernel import Totals, Workspace, summarize, token_sums
from hsstore.compare.sampling import choose_keys, full_layers, rate_bound
from hsstore.compare.stale import row_index, stale_copies
from hsstore.core.batching import token_budget_batches
from hsstore.core.dtypes import TORCH
from hsstore.core.errors import BadInput
from hsstore.core.layer_numbering import TOOL_CAPTURE, from_hsstore, to_hsstore
from hsstore.core.schema.manifest import ATTENTION, BACKENDS
from hsstore.core.schema.provenance import Batching, ImportSource
from hsstore.core.schema.record import Record, or_none
from hsstore.core.schema.reports import CheckReport, CheckVerdictKind, Finding, Restatement, SampleVerdict
from hsstore.storage.reader import VariantReader

if TYPE_CHECKING:
    from hsstore.capture.model.spec import ModelSpec

# --- What an audit is asked: the model, the variant, which of its samples, and how to recompute them


class AuditRequest(Record):
    """An audit of ``target`` (STORE#SELECTOR) against ``model``: ``samples`` (or a ``fraction``, or the ``keys``
    named by prefix; default 8) drawn with ``seed``, judged against ``floor`` (STORE#SELECTOR, or ``live``; None:
    live). A recompute setting left None is the recorded one, else a default (``how_to_recompute``)."""

    model: str
    target: str
    samples: int | None = None
    fraction: float | None = None
    seed: int = 0
    floor: str | None = None
    noise_factor: float = NOISE_FACTOR
    backend: str | None = None
    dtype: str | None = None
    device: str | None = None
    attention: str | None = None
    token_budget: int | None = None
    keys: list[str] | None = None


# --- How to recompute a variant's states: from its provenance where it says, from the user's options where

UNKNOWN = "unknown"
DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Recompute:
    """The settings of a recomputation; ``token_budget`` None = each sample alone (recorded plan: ``plan``)."""

    backend: str
    dtype: str
    device: str
    attention: str
    batching: str  # "recorded" | "alone" | "budget"
    token_budget: int | None = None
    assumed: dict[str, str] = field(default_factory=dict)  # field -> why this value (only what was not recorded)


def _known(value: object) -> str | None:
    v = or_none(value)
    return None if v in (None, UNKNOWN, "") else str(v)


def _pick(
    name: str,
    given: str | None,
    recorded: str | None,
    default: tuple[str, str],
    allowed: tuple[str, ...],
    assumed: dict[str, str],
) -> str:
    """The given value, else the recorded one, else ``default`` (value, why), with what was assumed noted."""
    if given is not None and given not in allowed:
        raise BadInput(f"--{name} {given!r}: choose one of {', '.join(allowed)}")
    if given is not None:
        if recorded is not None and recorded != given:
            assumed[name] = f"{given} (--{name}; the variant records {recorded})"
        return given
    if recorded is not None:
        return recorded
    assumed[name] = f"{default[0]} ({default[1]}; the variant records {name} unknown: pass --{name} to change)"
    return default[0]


def _computed_narrower(reader: VariantReader, assumed: dict[str, str]) -> str | None:
    """'bf16' or 'fp16' when every stored value of the variant's first sample is a value of that type: an
    imported fp32 cache computed at that precision and saved upcast (judged at fp32 it would read as
    beyond noise everywhere)."""
    from hsstore.compare.defects import narrower_values

    if not reader.keys:
        return None
    layers = reader.record.all_layers
    found = {narrower_values(x) for x in reader.read_layers(reader.refs[reader.keys[0]], layers)}
    narrow = found.pop() if len(found) == 1 else None
    if narrow is not None:
        assumed["dtype"] = (
            f"{narrow} (every stored value of the first sample is a {narrow} value: computed at "
            f"{narrow} and saved as fp32; the import does not record it: pass --dtype fp32 to judge "
            "the states at fp32)"
        )
    return narrow


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def how_to_recompute(reader: VariantReader, request: AuditRequest) -> Recompute:
    """The recomputation settings for ``reader``'s variant (``request``'s, where it names them), with every
    assumption named."""
    from hsstore.capture.model.kernels import installed, require_attention

    env = reader.record.prov.environment
    assumed: dict[str, str] = {}
    rec_device = _known(env.device)
    dev = request.device or (rec_device.split(":")[0] if rec_device else None)
    if dev is None:
        dev = default_device()
        assumed["device"] = (
            f"{dev} ({'a GPU is visible' if dev == 'cuda' else 'no GPU is visible'}; the variant "
            "records device unknown: pass --device to change)"
        )
    on_gpu = dev.startswith("cuda")
    fla_default = "fla" if on_gpu and installed("fla") else "torch"
    why_backend = (
        "the fla kernels are installed and it runs on a GPU"
        if fla_default == "fla"
        else ("transformers' reference kernels")
    )
    be = _pick("backend", request.backend, _known(env.backend), (fla_default, why_backend), BACKENDS, assumed)
    stored = reader.record.dtype if reader.record.dtype in DTYPES else _known(env.dtype)
    dt = _pick("dtype", request.dtype, stored, ("bf16", "the usual training dtype"), DTYPES, assumed)
    if request.dtype is None and dt == "fp32" and isinstance(reader.record.prov.source, ImportSource):
        dt = _computed_narrower(reader, assumed) or dt
    kernels = env.kernels.to_dict() if hasattr(env.kernels, "to_dict") else {}
    attn = _pick(
        "attn",
        request.attention,
        _known(kernels.get("attention")),
        ("sdpa", "transformers' default"),
        ATTENTION,
        assumed,
    )
    require_attention(attn, "install it on a GPU host, or pass --attn sdpa")
    budget = request.token_budget
    if budget is not None:
        if budget < 1:
            raise BadInput(f"--token-budget {budget}: must be 1 or more (padded tokens per batch), e.g. 2048")
        return Recompute(be, dt, dev, attn, "budget", budget, assumed)
    if isinstance(env.batching, Batching) and env.batching.token_budget >= 1:
        return Recompute(be, dt, dev, attn, "recorded", None, assumed)
    assumed["batching"] = (
        "each sample alone, unpadded (the variant records no batching; pass --token-budget N "
        "to recompute in hsstore's token-budget batches instead)"
    )
    return Recompute(be, dt, dev, attn, "alone", None, assumed)


# --- What an imported cache's ``--layers``/``--capture`` statement should have been, from the audit's findings


def held_points(
    verdicts: Sequence[SampleVerdict], findings: Sequence[Finding], labels: Sequence[int]
) -> dict[int, set[int]]:
    """Stored label -> the capture points it held across the checked samples (as labelled where clean; the
    match where a capture point, also beside NaN/zero rows; samples where it shows another defect say nothing)."""
    match = {(f.key, f.layer): f.match for f in findings if f.kind == "capture_point"}
    held: dict[int, set[int]] = {i: set() for i in labels}
    for v in verdicts:
        for i in labels:
            kind = v.layers.get(str(i))
            if kind in CLEAN:
                held[i].add(i)
            elif "capture_point" in str(kind).split("+") and isinstance(m := match.get((v.key, i)), int):
                held[i].add(int(m))
    return held


def restatement(
    verdicts: Sequence[SampleVerdict], findings: Sequence[Finding], source: ImportSource, n_layers: int
) -> Restatement | None:
    """The statement that labels every slot with what it holds, or None when the stated one is right (and
    known), or the samples do not agree on one (then the findings say what is wrong, slot by slot)."""
    labels = [to_hsstore(s, source.capture, n_layers) for s in source.layers]  # hsstore labels, file slot order
    held = held_points(verdicts, findings, labels)
    if any(len(held[i]) != 1 for i in labels):
        return None
    slots = [next(iter(held[i])) for i in labels]
    if len(set(slots)) != len(slots) or (slots == labels and source.capture != "unknown") or min(slots) < 0:
        return None  # two slots hold one point (no statement fixes that), the statement is right, or a slot
        # holds the embeddings (no hsstore layer id names them)
    numbering = TOOL_CAPTURE.get(source.format, "output")
    ids = ",".join(str(from_hsstore(p, numbering, n_layers)) for p in slots)
    other = "output" if numbering == "input" else "input"
    other_ids = ",".join(str(from_hsstore(p, other, n_layers)) for p in slots)
    stated = ",".join(map(str, source.layers))
    flags = f"--layers {ids} --capture {numbering}"
    what = "leaves the numbering unknown" if source.capture == "unknown" else "is wrong"
    words = (
        f"the file slots hold hsstore layers {slots} (output of decoder layer i; {n_layers} = after the final "
        f"norm): --layers {stated} --capture {source.capture} {what}; import again with {flags} (= --layers "
        f"{other_ids} --capture {other})"
    )
    return Restatement(slots=slots, stated=f"--layers {stated} --capture {source.capture}", flags=flags, words=words)


LIVE = "live"


def wants_audit(reader: VariantReader, request: AuditRequest) -> bool:
    """True for a variant whose environment is not recorded (an import), or when ``request`` asks for an audit:
    ``--floor live`` or an option only the audit takes (backend, dtype, attention, token budget, fraction, keys)."""
    env = reader.record.prov.environment
    unknown = "unknown" in (or_none(env.device), or_none(env.backend))
    options = (request.backend, request.dtype, request.attention, request.token_budget, request.fraction, request.keys)
    return unknown or request.floor == LIVE or any(v is not None for v in options)


def bind(how: Recompute) -> None:
    """Make this process bind ``how.backend``'s kernels — before anything imports transformers' modeling
    modules (a model's config does), since transformers binds them once per process; BadInput when that
    backend cannot run here."""
    from hsstore.capture.model.kernels import force_backend, installed

    if how.backend == "fla" and not installed("fla"):
        raise BadInput(
            "backend 'fla' needs the flash-linear-attention kernels, which are not installed here: pip "
            "install flash-linear-attention fla-core on a GPU host, or pass --backend torch"
        )
    try:
        force_backend(how.backend)
    except RuntimeError:
        pass  # modeling modules already imported (a second audit in one process): compared by load()


def load(spec: ModelSpec, how: Recompute, dtype: str) -> Any:
    """The model at ``dtype``; BadInput when this process binds other kernels than ``how.backend``'s."""
    from hsstore.capture.model.kernels import bound_kernels, why_not

    try:
        model = spec.load(TORCH[dtype] if dtype in TORCH else torch.float64, how.device, how.attention)
    except ImportError as e:  # an attention implementation whose package transformers cannot import
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(
            f"cannot load {spec.path} with {how.attention!r} attention here ({first}); pass --attn sdpa"
        ) from e
    bound = bound_kernels(model).get("chunk_gated_delta_rule")
    if bound not in (None, "none", how.backend) and how.backend in ("torch", "fla") and bound in ("torch", "fla"):
        raise BadInput(
            f"this process binds the {bound!r} gated-delta kernels, not {how.backend!r}; "
            f"{why_not(model, how.backend)}; or run `hsstore check` in a fresh process (--backend {how.backend})"
        )
    return model


def batches(reader: VariantReader, how: Recompute, keys: list[str]) -> BatchPlan:
    """Each chosen sample alone, or the recorded / a token-budget plan over every sample of the variant."""
    if how.batching == "recorded":
        return batch_plan(reader)
    if how.batching == "budget" and how.token_budget is not None:
        allk = reader.keys
        plan = token_budget_batches([reader.refs[k].length for k in allk], how.token_budget, bucketed=True)
        return BatchPlan([[allk[i] for i in b] for b in plan], True, how.token_budget)
    return BatchPlan([[k] for k in keys], False, 0)


@dataclass(frozen=True)
class Recomputed:
    """What an audit recomputes with: the variant, the settings, the model (live and, for a live floor, in
    ``floor_dtype``), the chosen samples in their batch plan, and the stored floor (None: none or live)."""

    reader: VariantReader
    how: Recompute
    spec: ModelSpec
    models: list[Any]
    keys: list[str]
    plan: BatchPlan
    n_layers: int
    vocab: int
    in_live: list[int]  # the stored layers the live model computes (the rest are not its outputs)
    floor_dtype: str | None
    stored_floor: VariantReader | None


@dataclass(frozen=True)
class Judged:
    """What an audit found: per-sample verdicts, the findings, the per-layer sums of live against stored states
    (``ftotals``: stored against the floor) and, for an import, the statement its layers should have had."""

    verdicts: list[SampleVerdict]
    findings: list[Finding]
    totals: Totals
    ftotals: Totals
    restated: Restatement | None


def run_audit(request: AuditRequest) -> CheckReport:
    """Audit the samples ``request`` chooses of its target against its model: per sample and layer, bit-exact /
    within noise / the defect it shows."""
    t0 = time.perf_counter()
    run = recompute_setup(request)
    reader, keys, labels = run.reader, run.keys, run.reader.record.all_layers
    points = [EMBEDDINGS] + list(range(run.n_layers + 1))
    stream = live_states(run.models, reader, run.plan, keys, points, run.how.device, pad_id(run.spec))
    evidence, verdicts, findings, totals, ftotals = _judge_all(stream, run, request.noise_factor)
    if any(f.kind in ("beyond_noise", "differs", "suffix_states") for f in findings):
        findings = stale_copies(findings, evidence, *row_index(reader, keys, labels), vocab=run.vocab)
    noisy = frozenset((k, e.label) for k, evs in evidence.items() for e in evs if e.noise_like)
    findings = other_weights(apply(verdicts, findings), findings, noisy)
    verdicts = apply(verdicts, findings)
    source = reader.record.prov.source
    restated = restatement(verdicts, findings, source, run.n_layers) if isinstance(source, ImportSource) else None
    return _report(request, run, Judged(verdicts, findings, totals, ftotals, restated), t0)


def recompute_setup(request: AuditRequest) -> Recomputed:
    """Open the target, settle how to recompute, choose the samples, refuse a model of other shapes, and load
    the model (and, for a live floor, again in fp32; fp64 for an fp32 variant)."""
    reader = open_target(request.target)
    how = how_to_recompute(reader, request)
    bind(how)
    how = Recompute(
        how.backend, how.dtype, check_device(how.device), how.attention, how.batching, how.token_budget, how.assumed
    )
    spec = model_spec(request.model, reader.record.prov.recipe)
    keys = choose_keys(reader, request.samples, request.fraction, request.seed, request.keys)
    n_layers, vocab = check_shapes(spec, reader, keys)
    floor_t = request.floor
    stored_floor = open_target(floor_t) if floor_t not in (None, LIVE) else None
    use_live_floor = stored_floor is None and (floor_t == LIVE or floor_t is None)
    floor_dtype = ("fp64" if how.dtype == "fp32" else "fp32") if use_live_floor else None
    models = [load(spec, how, how.dtype)] + ([load(spec, how, floor_dtype)] if floor_dtype else [])
    in_live = [i for i in reader.record.all_layers if i <= n_layers]
    return Recomputed(
        reader, how, spec, models, keys, batches(reader, how, keys), n_layers, vocab, in_live, floor_dtype, stored_floor
    )


def _judge_all(
    stream: Iterator[tuple[str, list[dict[int, torch.Tensor]]]], run: Recomputed, noise_factor: float
) -> tuple[dict[str, list[LayerEvidence]], list[SampleVerdict], list[Finding], Totals, Totals]:
    """Evidence, verdicts and findings of every recomputed sample, and the per-layer sums of live against
    stored states (and of stored against the floor)."""
    reader, in_live, dev = run.reader, run.in_live, run.how.device
    labels, aux, tgt = (
        reader.record.all_layers,
        reader.record.layers.get("aux", []),
        reader.record.layers.get("target", []),
    )
    target_label = tgt[0] if len(tgt) == 1 else None
    ws = _workspace(run)
    hidden, ulps = reader.record.hidden_size, reader.record.dtype == "bf16"
    totals, ftotals = Totals(len(in_live)), Totals(len(in_live))
    evidence: dict[str, list[LayerEvidence]] = {}
    verdicts: list[SampleVerdict] = []
    findings: list[Finding] = []
    for key, outs in stream:
        # computed at the recompute dtype, stored as the variant stores its states (its dtype, its quantizer)
        live = {j: as_stored(x.to(TORCH[reader.record.dtype]), reader) for j, x in outs[0].items()}
        floor = outs[1] if len(outs) > 1 else _stored_floor(run.stored_floor, key, labels, dev)
        stored = dict(zip(labels, reader.read_layers(reader.refs[key], labels)))
        ids = torch.from_numpy(reader.read_tokens(reader.refs[key])[0].astype("int64")).to(dev)
        ev = sample_evidence({i: s.to(dev) for i, s in stored.items()}, live, floor, target_label, noise_factor, ids)
        evidence[key] = ev
        v, f = judge_sample(key, ev, aux, target_label, run.n_layers, noise_factor)
        verdicts.append(v)
        findings += f
        live_cpu, kept = [live[i].cpu() for i in in_live], [stored[i] for i in in_live]
        totals.add(summarize(key, token_sums(live_cpu, kept, ws, ulps), hidden, ws))
        if floor is not None and all(i in floor for i in in_live):
            ftotals.add(summarize(key, token_sums(kept, [floor[i].float().cpu() for i in in_live], ws), hidden, ws))
    return evidence, verdicts, findings, totals, ftotals


def _workspace(run: Recomputed) -> Workspace:
    """The workspace of the audit's sums, on the C loops only where they pay: over live against stored states
    (ULPs for a bf16 variant) and, where a floor holds every live layer, stored against the floor (no ULPs)."""
    reader, in_live = run.reader, run.in_live
    bf16 = reader.record.dtype == "bf16"
    floored = run.floor_dtype is not None or (
        run.stored_floor is not None  # (compared only where it holds them all)
        and set(in_live) <= set(run.stored_floor.record.all_layers)
    )
    pairs = [bf16] + ([False] if floored else [])  # (the floor: no ULPs)
    return Workspace("cpu", use_compiled(reader, run.keys, in_live, pairs))  # the C loops only where they pay


def _stored_floor(floor: VariantReader | None, key: str, labels: list[int], dev: str) -> dict[int, torch.Tensor] | None:
    if floor is None or key not in floor.refs:
        return None
    have = [i for i in labels if i in floor.record.all_layers]
    return {i: s.to(dev) for i, s in zip(have, floor.read_layers(floor.refs[key], have))}


def _report(request: AuditRequest, run: Recomputed, judged: Judged, t0: float) -> CheckReport:
    """The audit's report: what was recomputed how, what each sample and layer showed, and what they bound."""
    from hsstore.compare.check import live_differences

    reader, how, spec, live_model, keys = run.reader, run.how, run.spec, run.models[0], run.keys
    verdicts, findings, restated, model = judged.verdicts, judged.findings, judged.restated, request.model
    identity = spec.identity(live_model.config).to_dict()
    recorded_fp = str(or_none(reader.record.prov.recipe.model.fingerprint) or "")
    notes, extra = _notes(spec, reader, model)
    est = full_layers(run.in_live, judged.totals, reader.record.dtype == "bf16")
    bad, counts, upper, bound, kind, text = _verdict(verdicts, findings, len(reader.keys), request.keys is not None)
    if restated is not None:
        extra["restatement"] = restated
        text += f"; {restated.words}"
    batching, recompute = _recompute_fields(run)
    diffs = [d for d in live_differences(live_model, reader, identity) if d.b != "unknown"]
    extra.update(_floor_fields(run, judged))
    return CheckReport(
        notes=notes,
        model=model,
        target=request.target,
        variant=f"{reader.store.location}#{reader.id}",
        device=how.device,
        dtype=how.dtype,
        model_fingerprint=identity["fingerprint"],
        recorded_model_fingerprint=recorded_fp,
        same_model=identity["fingerprint"] == recorded_fp,
        samples=len(verdicts),
        tokens=sum(reader.refs[k].length for k in keys),
        keys=keys,
        batches=sum(1 for b in run.plan.batches if set(b) & set(keys)),
        batching=batching,
        layers=est.layers,
        environment_differences=diffs,
        verdict=text,
        verdict_kind=kind,
        seconds=time.perf_counter() - t0,
        recompute=recompute,
        assumed=how.assumed,
        population=len(reader.keys),
        sample_verdicts=verdicts,
        findings=findings,
        defects=counts,
        defective_samples=len(bad),
        defect_rate_upper=upper,
        bound=bound,
        **extra,
    )


def _notes(spec: ModelSpec, reader: VariantReader, model: str) -> tuple[list[str], dict[str, Any]]:
    """The report's notes — what an import left unrecorded, a tokenizer other than the one that made the
    variant's tokens — and the tokenizer fingerprints (none when the model has no tokenizer to load)."""
    from hsstore.storage.info import import_gaps

    extra: dict[str, Any] = {}
    notes = import_gaps(reader.store, reader.id)
    tok = _tokenizer_fingerprint(spec)
    if tok is not None:
        rec_tok = str(or_none(reader.record.prov.recipe.tokenizer.fingerprint) or "")
        extra.update(tokenizer_fingerprint=tok, recorded_tokenizer_fingerprint=rec_tok, same_tokenizer=tok == rec_tok)
        if tok != rec_tok:
            notes.append(
                f"the variant's tokens were made by tokenizer {rec_tok[:16]} (recipe.tokenizer), {model}'s "
                f"tokenizer is {tok[:16]}: the states are judged for the stored token ids, but a dataset "
                "tokenized by this model's tokenizer has other sample keys and will not find them"
            )
    return notes, extra


def _recompute_fields(run: Recomputed) -> tuple[str, dict[str, Any]]:
    """How the samples were recomputed: the batching in words, and the settings as the report records them."""
    how = run.how
    batching = {
        "recorded": "the recorded batch plan",
        "alone": "each sample alone, unpadded",
        "budget": f"token-budget batches of {how.token_budget} over every sample",
    }[how.batching]
    return batching, {
        "backend": how.backend,
        "dtype": how.dtype,
        "device": how.device,
        "attention": how.attention,
        "batching": how.batching,
        "token_budget": how.token_budget,
        "floor_dtype": run.floor_dtype,
    }


def _floor_fields(run: Recomputed, judged: Judged) -> dict[str, Any]:
    """The floor the states were judged against, in words, and the stored states' layers against it (where
    any floor sums were added); nothing without a floor."""
    floor_words = (
        f"live: the same samples recomputed in {run.floor_dtype}"
        if run.floor_dtype
        else f"{run.stored_floor.store.location}#{run.stored_floor.id}"
        if run.stored_floor is not None
        else UNSET_FLOOR
    )
    if floor_words == UNSET_FLOOR:
        return {}
    out: dict[str, Any] = {"floor": floor_words}
    if judged.ftotals.sums.any():
        out["floor_layers"] = full_layers(run.in_live, judged.ftotals, False).layers
    return out


UNSET_FLOOR = "none"


def _tokenizer_fingerprint(spec: ModelSpec) -> str | None:
    """The fingerprint of the model's tokenizer as a build would record it; None when it has none to load."""
    try:
        return spec.tokenizer_identity(spec.tokenizer()).fingerprint
    except (OSError, ValueError, BadInput):
        return None


def _plural(findings: list[Finding], kind: str) -> str:
    layers = sorted({f.layer for f in findings if f.kind == kind and f.layer is not None})
    return ("s " if len(layers) > 1 else " ") + ", ".join(map(str, layers)) if layers else "s -"


def _verdict(
    verdicts: list[SampleVerdict], findings: list[Finding], N: int, named: bool = False
) -> tuple[list[SampleVerdict], dict[str, int], float | None, str, CheckVerdictKind, str]:
    """(defective verdicts, samples per class, the defect-rate bound and its words, verdict kind, verdict line)."""
    bad = [v for v in verdicts if v.verdict not in ("bit_exact", "within_noise")]
    counts: dict[str, int] = {k: sum(1 for v in verdicts if k in v.verdict.split("+")) for k in DEFECTS}
    counts = {k: n for k, n in counts.items() if n}
    n = len(verdicts)
    upper, bound = rate_bound(len(bad), n, N, named)
    if not bad:
        kind: CheckVerdictKind = "identical" if all(v.verdict == "bit_exact" for v in verdicts) else "within_noise"
        text = (
            f"AGREES: every one of the {n} checked samples is "
            + ("bit-exact" if kind == "identical" else "bit-exact or within precision noise")
            + " in every stored layer"
        )
    else:
        kind = "beyond_noise"
        text = f"DEFECTS in {len(bad)} of {n} checked samples: " + ", ".join(
            f"{k} ({c} sample{'s' if c > 1 else ''}, layer{_plural(findings, k)})" for k, c in counts.items()
        )
    return bad, counts, upper, bound, kind, text

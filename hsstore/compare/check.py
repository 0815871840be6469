"""``hsstore check``: recompute stored samples with a model in this process and compare them with the
store, layer by layer — what an eval harness runs to prove its live states are the cached ones.

Like with like: stored states are those of the build's batch plan (right-padded, attention-masked
batches from ``hsstore.core.batching.token_budget_batches`` over every sample of the variant, longest
first, each padded to its recorded width policy). check rebuilds that plan from the variant's committed
samples and ``environment.batching`` and recomputes the *whole batch* each chosen sample was in, with
the recorded dtype, attention implementation and kernels, on the recorded device type. Then the same
kernels, shapes and inputs give the same bits: on the CPU, fp32 and bf16 agree bit-exactly (tested).
What differs and is expected to: a sample run alone (unpadded) instead of in its batch differs within
roundoff in bf16 (attention over another padded width sums in another order; the linear-attention
chunking likewise) — check never does that; a variant filled by several builds over growing inputs
holds samples of several plans, and the ones whose batch changed differ within roundoff (the report's
``batches`` says which plan was assumed); GPU kernels that are not deterministic differ run to run.
Backends: transformers binds the gated-delta and conv1d kernels when its modeling modules are
imported, so check forces the recorded backend before that and refuses (exit 2) when this process
already bound others (run it in a fresh process, as the CLI does).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hsstore.capture.model.kernels import bound_kernels, force_backend, why_not
from hsstore.capture.model.spec import ModelSpec, text_config
from hsstore.capture.run.hooks import LayerCapture, pad_batch
from hsstore.compare.diff import (
    NOISE_FACTOR,
    check_device,
    open_target,
    provenance_differences,
    same_variant,
    use_compiled,
)
from hsstore.compare.kernel import Totals, Workspace, summarize, token_sums
from hsstore.compare.sampling import Estimate, choose, full_layers, sample_count, with_floor, without_floor
from hsstore.core import quant
from hsstore.core.batching import POLICY, padded_length, token_budget_batches
from hsstore.core.dtypes import TORCH
from hsstore.core.errors import BadInput
from hsstore.core.outputs import expand_user
from hsstore.core.provenance_match import flatten, require_match
from hsstore.core.schema.provenance import Batching, Recipe
from hsstore.core.schema.record import is_set, or_none
from hsstore.core.schema.reports import CheckReport, CheckVerdictKind, FieldDifference, LayerDiff, LiveFingerprint
from hsstore.storage.reader import VariantReader

# --- Whether a model can produce a variant's stored shapes — hidden size, layer count (and every stored layer


def model_config(spec: ModelSpec) -> Any:
    """The model's config (a builtin's sized to its tokenizer), without loading weights."""
    return spec.config(len(spec.tokenizer())) if spec.builtin is not None else spec.config()


def check_shapes(spec: ModelSpec, reader: VariantReader, keys: list[str], config: Any = None) -> tuple[int, int]:
    """(num_layers, vocab) of the model's config; BadInput (exit 2) when it cannot produce the stored shapes
    — read from the config alone, before any weights load."""
    from hsstore.capture.model.spec import text_config

    tc = text_config(config if config is not None else model_config(spec))
    layers, hidden, vocab = int(tc.num_hidden_layers), int(tc.hidden_size), int(tc.vocab_size)
    rec = reader.record
    name = spec.path
    if hidden != rec.hidden_size:
        raise BadInput(
            f"{name} has hidden_size {hidden}, variant {reader.id} stores states of width {rec.hidden_size}: "
            "this model cannot produce them; pass the model the cache was made with"
        )
    recorded = or_none(rec.prov.recipe.model.num_layers)
    if isinstance(recorded, int) and recorded != layers:
        raise BadInput(
            f"{name} has {layers} decoder layers, variant {reader.id} was made by a model with {recorded}: "
            "pass the model the cache was made with"
        )
    if max(rec.all_layers) > layers:
        raise BadInput(
            f"variant {reader.id} stores layer {max(rec.all_layers)}, {name} has layers 0..{layers - 1} "
            f"(and {layers} = after the final norm): pass the model the cache was made with"
        )
    top = max((int(reader.read_tokens(reader.refs[k])[0].max()) for k in keys), default=0)
    if top >= vocab:
        raise BadInput(
            f"variant {reader.id} holds token id {top}, {name} has a vocabulary of {vocab}: another "
            "tokenizer's cache; pass the model the cache was made with"
        )
    return layers, vocab


DEFAULT_SAMPLES = 8


@dataclass(frozen=True)
class BatchPlan:
    """The build's batches over the variant's committed samples (keys), and how they were padded."""

    batches: list[list[str]]
    bucketed: bool
    token_budget: int


def batch_plan(reader: VariantReader) -> BatchPlan:
    """Rebuild the build's batch plan from ``environment.batching`` and the committed samples (in
    commit order: the order the build ran them, which keeps ties among equal lengths as they were)."""
    batching = reader.record.prov.environment.batching
    shown = batching.to_dict() if isinstance(batching, Batching) else {}
    if isinstance(batching, Batching) and (batching.padding_side != "right" or not batching.attention_mask):
        raise BadInput(
            f"variant {reader.id} records batching {shown}; check recomputes right-padded, "
            "attention-masked batches only"
        )
    if not isinstance(batching, Batching) or batching.token_budget < 1:
        raise BadInput(
            f"variant {reader.id} records no token budget (environment.batching = {shown}); "
            "check cannot rebuild the batches its states were computed in"
        )
    budget = batching.token_budget
    policy = or_none(batching.padded_lengths)
    if policy not in (None, POLICY):
        raise BadInput(
            f"variant {reader.id} was padded by policy {policy!r}, which this hsstore does not know "
            f"(it knows {POLICY!r}); upgrade hsstore"
        )
    keys = reader.keys
    plan = token_budget_batches([reader.refs[k].length for k in keys], budget, bucketed=policy is not None)
    return BatchPlan([[keys[i] for i in b] for b in plan], policy is not None, budget)


def model_spec(model: str, recipe: Recipe) -> ModelSpec:
    """MODEL as a ModelSpec: a build manifest (its [model] table), a builtin (seeded as recorded) or a
    local HF model directory."""
    if model.endswith(".toml"):
        from hsstore.capture.inputs.manifest_file import load_manifest

        m = load_manifest(model)
        return ModelSpec(m.model_path, m.config_overrides, m.seed, m.trust_remote_code, m.init_device)
    rec = recipe.model
    if model.startswith("builtin:"):
        seed, init_device = or_none(rec.seed), or_none(rec.init_device)
        return ModelSpec(model, seed=seed if seed is not None else 0, init_device=init_device or "cpu")
    return ModelSpec(expand_user(model))


def bind_backend(reader: VariantReader) -> None:
    """Make this process bind the recorded backend's kernels (before transformers' modeling modules
    load); if they already loaded, the bound kernels are compared after loading instead."""
    backend = reader.record.prov.environment.backend
    try:
        force_backend(backend)
    except RuntimeError:
        pass  # already imported: load_model compares what is bound with what was recorded


def load_model(spec: ModelSpec, reader: VariantReader, device: str) -> Any:
    env = reader.record.prov.environment
    recorded = env.kernels.to_dict()
    dtype = reader.record.dtype if reader.record.dtype in TORCH else env.dtype
    model = spec.load(TORCH[dtype], device, env.kernels.attention)
    bound = bound_kernels(model)
    wrong = {k: (bound.get(k), v) for k, v in recorded.items() if bound.get(k) != v}
    if wrong:
        what = ", ".join(f"{k}: {b!r} here, {v!r} recorded" for k, (b, v) in wrong.items())
        refuse_other_model(spec.identity(model.config).to_dict(), reader, f"it binds other kernels ({what})")
        raise BadInput(
            f"this process binds other kernels than variant {reader.id} was computed with ({what}): "
            f"{why_not(model, env.backend)}; or run `hsstore check` in a fresh process with the recorded "
            f"backend's packages installed (backend {env.backend!r})"
        )
    return model


def live_states(
    models: list[Any], reader: VariantReader, plan: BatchPlan, keys: list[str], points: list[int], device: str, pad: int
) -> Iterator[tuple[str, list[dict[int, torch.Tensor]]]]:
    """(key, [per model: capture point -> [T, H] on the device]) for each chosen sample, computed in its
    batch of ``plan``, batch by batch."""
    n_layers = int(text_config(models[0].config).num_hidden_layers)
    caps = [LayerCapture(m, n_layers, points) for m in models]
    want = set(keys)
    try:
        for batch in plan.batches:
            if not want.intersection(batch):
                continue
            seqs = [torch.from_numpy(reader.read_tokens(reader.refs[k])[0].astype("int64")) for k in batch]
            longest = max(int(s.shape[0]) for s in seqs)
            ids, mask = pad_batch(seqs, pad, device, padded_length(longest) if plan.bucketed else longest)
            outs = [c.run(ids, mask) for c in caps]
            for b, key in enumerate(batch):
                if key in want:
                    n = int(seqs[b].shape[0])
                    yield key, [{j: o[j][b, :n] for j in points if j in o} for o in outs]
    finally:
        for c in caps:
            c.close()


def recompute(
    model: Any, reader: VariantReader, plan: BatchPlan, chosen: list[str], layers: list[int], device: str, pad_id: int
) -> dict[str, list[torch.Tensor]]:
    """The live states ``[T, H]`` per layer of each chosen sample, computed in its recorded batch."""
    return {
        key: [as_stored(states[i], reader).to("cpu") for i in layers]
        for key, (states,) in live_states([model], reader, plan, chosen, layers, device, pad_id)
    }


def as_stored(x: torch.Tensor, reader: VariantReader) -> torch.Tensor:
    """Live states as the variant stores them: through the same quantizer (on the same device, where the
    build quantized them) for a variant stored at a reduced precision, else unchanged."""
    if reader.record.stored_precision is None:
        return x
    return quant.dequantize(quant.quantize(x), torch.float32).to(x.dtype)


def compare_live(
    reader: VariantReader,
    live: dict[str, list[torch.Tensor]],
    keys: list[str],
    layers: list[int],
    floor: VariantReader | None = None,
) -> tuple[Totals, Totals | None]:
    """Sums of live (A) against stored (B) states, and of stored against the floor's, per layer."""
    ulps = reader.record.dtype == "bf16"
    fulps = ulps and floor is not None and floor.record.dtype == "bf16"
    pairs = [ulps] + ([fulps] if floor is not None else [])
    ws = Workspace("cpu", use_compiled(reader, keys, layers, pairs))  # the C loops only where they pay
    totals, ftotals = Totals(len(layers)), (Totals(len(layers)) if floor is not None else None)
    for key in keys:
        stored = reader.read_layers(reader.refs[key], layers)
        totals.add(summarize(key, token_sums(live[key], stored, ws, ulps), reader.record.hidden_size, ws))
        if floor is not None and ftotals is not None:
            ref = floor.read_layers(floor.refs[key], layers)
            ftotals.add(summarize(key, token_sums(stored, ref, ws, fulps), reader.record.hidden_size, ws))
    return totals, ftotals


def choose_keys(reader: VariantReader, samples: int | None, seed: int) -> list[str]:
    keys = reader.keys
    n = sample_count(len(keys), samples or DEFAULT_SAMPLES, None)
    choice = choose([reader.refs[k].length for k in keys], keys, n, seed)
    return [keys[int(i)] for i in choice.indices]


def pad_id(spec: ModelSpec) -> int:
    """The pad id the build used (it pads after every real token and is masked: any id gives the same
    states, but like with like)."""
    tok = spec.tokenizer()
    return int(tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0))


def live_differences(model: Any, reader: VariantReader, identity: dict[str, Any]) -> list[FieldDifference]:
    """Fields of the live model's fingerprint that differ from the variant's provenance."""

    have = live_fingerprint(model)
    have["recipe"]["model"]["fingerprint"] = identity["fingerprint"]
    fields = (*LIVE_FIELDS, "recipe.model.fingerprint")
    diffs = provenance_differences(_restrict(have, fields), _restrict(reader.record.provenance, fields))
    return [d for d in diffs if not d.informational]


def run_check(
    model: str,
    target: str,
    samples: int | None = None,
    seed: int = 0,
    device: str | None = None,
    floor_t: str | None = None,
    noise_factor: float = NOISE_FACTOR,
) -> CheckReport:
    """Recompute ``samples`` stored samples of ``target`` with ``model`` here and compare, per layer."""
    t0 = time.perf_counter()
    reader = open_target(target)
    floor = _open_floor(reader, floor_t)
    device = check_device(device or reader.record.prov.environment.device)
    spec, live_model, identity = _load_checked(model, reader, samples, seed, device)
    plan, keys, layers = batch_plan(reader), choose_keys(reader, samples, seed), reader.record.all_layers
    recorded_fp, other, notes = _other_weights(identity, reader, len(keys))
    live = recompute(live_model, reader, plan, keys, layers, device, pad_id(spec))
    totals, ftotals = compare_live(reader, live, keys, layers, floor)
    est = full_layers(layers, totals, reader.record.dtype == "bf16")
    reps, text, kind, extra = check_verdict(est, ftotals, layers, reader, floor, noise_factor, other)
    n_batches = sum(1 for b in plan.batches if set(b) & set(keys))
    return CheckReport(
        model=model,
        target=target,
        variant=f"{reader.store.location}#{reader.id}",
        device=device,
        dtype=reader.record.dtype,
        model_fingerprint=identity["fingerprint"],
        recorded_model_fingerprint=recorded_fp,
        same_model=identity["fingerprint"] == recorded_fp,
        samples=len(keys),
        keys=keys,
        tokens=sum(reader.refs[k].length for k in keys),
        batches=n_batches,
        batching=(
            f"{len(plan.batches)} batches of at most {plan.token_budget} padded tokens over the variant's "
            f"{len(reader.keys)} samples, longest first, right-padded "
            f"{'to ' + POLICY if plan.bucketed else 'to the longest sample'}, attention-masked"
        ),
        layers=reps,
        environment_differences=live_differences(live_model, reader, identity),
        verdict=text,
        verdict_kind=kind,
        notes=notes,
        seconds=time.perf_counter() - t0,
        **extra,
    )


def _open_floor(reader: VariantReader, floor_t: str | None) -> VariantReader | None:
    """The floor ``floor_t`` names (None without one); BadInput when it is the checked variant itself, or when
    either is stored at a reduced precision (their divergence would be storage error, not precision noise)."""
    floor = open_target(floor_t) if floor_t else None
    if floor is not None and same_variant(floor, reader):
        raise BadInput(
            f"the floor {floor_t!r} is the checked variant itself; pass another variant of the same "
            "recipe, e.g. the fp32 one"
        )
    for name, x in (("the checked variant", reader), ("the floor", floor)) if floor is not None else ():
        if x.record.stored_precision:
            raise BadInput(
                f"{name} ({x.id}) is stored as {x.record.stored_precision}: its divergence from the floor "
                "would be storage error, not precision noise; check it without --floor (live states are "
                "quantized as the build did, so a correct store reads identical)"
            )
    return floor


def _load_checked(
    model: str, reader: VariantReader, samples: int | None, seed: int, device: str
) -> tuple[ModelSpec, Any, dict[str, Any]]:
    """(spec, the loaded model, its identity): the recorded backend bound first, the stored shapes checked
    against the model's config before any weights load (a config that does not load is named by loading the
    model), the model's geometry against the recorded one after."""
    bind_backend(reader)
    spec = model_spec(model, reader.record.prov.recipe)
    try:
        config = model_config(spec)
    except BadInput:
        config = None  # loading it names what is wrong with the model
    if config is not None:
        check_shapes(spec, reader, choose_keys(reader, samples, seed), config)  # before any weights load
    live_model = load_model(spec, reader, device)
    identity = spec.identity(live_model.config).to_dict()
    check_geometry(identity, reader)
    return spec, live_model, identity


def _other_weights(identity: dict[str, Any], reader: VariantReader, n_keys: int) -> tuple[str, bool, list[str]]:
    """(the recorded model fingerprint, whether the model's is another, the note that says so): other weights
    are said on stderr at once, before the recompute, which only measures how far they land."""
    recorded_fp = str(or_none(reader.record.prov.recipe.model.fingerprint) or "")
    other = recorded_fp not in ("", "unknown") and identity["fingerprint"] != recorded_fp
    notes = (
        [
            f"the model's fingerprint {identity['fingerprint']} is not the recorded {recorded_fp}: these are other "
            "weights (or another config), so the states are expected to differ"
        ]
        if other
        else []
    )
    if other:  # said before the recompute, which only measures how far other weights land
        print(
            f"note: {notes[0]}; recomputing {n_keys} sample(s) only to measure how far (Ctrl-C stops it; "
            "pass the model the variant was built from to check the store)",
            file=sys.stderr,
            flush=True,
        )
    return recorded_fp, other, notes


def refuse_other_model(identity: dict[str, Any], reader: VariantReader, why: str) -> None:
    """BadInput (exit 2, as for a geometry mismatch) when the model is not the one the variant recorded
    and ``why`` says it cannot recompute the stored states at all: both models are named."""
    rec = reader.record.prov.recipe.model
    recorded = str(or_none(rec.fingerprint) or "")
    if recorded and identity["fingerprint"] != recorded:  # (a variant that recorded none cannot tell)
        raise BadInput(
            f"the model is another model than variant {reader.id} was computed by: {identity['name']} "
            f"(fingerprint {identity['fingerprint']}) here, {rec.name} (fingerprint {recorded}) "
            f"recorded, and {why}; pass the model (or build manifest) the variant was built from"
        )


def check_geometry(identity: dict[str, Any], reader: VariantReader) -> None:
    rec = reader.record.prov.recipe.model
    for field, recorded in (("num_layers", rec.num_layers), ("hidden_size", rec.hidden_size)):
        if is_set(recorded) and recorded != identity[field]:
            why = f"it has {field} = {identity[field]}, not {recorded}"
            refuse_other_model(identity, reader, why)
            raise BadInput(
                f"the model has {field} = {identity[field]}, variant {reader.id} was computed by a model "
                f"with {recorded}: these are different models; pass the model (or build manifest) "
                "the variant was built from"
            )


def check_verdict(
    est: Estimate,
    ftotals: Totals | None,
    layers: list[int],
    reader: VariantReader,
    floor: VariantReader | None,
    noise_factor: float,
    other_weights: bool = False,
) -> tuple[list[LayerDiff], str, CheckVerdictKind, dict[str, Any]]:
    dtype = reader.record.dtype
    extra: dict[str, Any] = {}
    if all(L.bit_exact == 1.0 for L in est.layers):
        return est.layers, "identical: the live model reproduces every stored value bit-exactly", "identical", extra
    if floor is not None and ftotals is not None:
        fest = full_layers(layers, ftotals, dtype == "bf16" and floor.record.dtype == "bf16")
        reps, text, kind = with_floor(est, fest, dtype, noise_factor, 0.95)
        # (the floor's full totals have no replicates, so no interval straddles the bound)
        assert kind != "inconclusive", "a check's floor comparison has no intervals"
        extra = {"floor": f"{floor.store.location}#{floor.id}", "floor_layers": fest.layers}
        return reps, text.replace("A and B differ", "live and stored states differ"), kind, extra
    reps, text = without_floor(est, dtype)
    worst = max(reps, key=lambda L: L.rel_l2)
    advice = (
        "the model's weights are not the variant's (see the note): pass the model the variant was built from "
        "(a precision floor cannot make other weights agree)"
        if other_weights
        else "pass --floor STORE#fp32-variant to judge it"
    )
    return (
        reps,
        (
            f"differs: the live model does not reproduce the stored states bit-exactly (worst rel-L2 "
            f"{worst.rel_l2:.3g} at layer {worst.layer}); {advice}"
        ),
        "differs",
        extra,
    )


# --- Fingerprint a model already loaded in this process and check it against a variant's provenance.

# environment fields a live model can be fingerprinted on (batching and host are a build's business)
LIVE_FIELDS = (
    "environment.kernels",
    "environment.dtype",
    "environment.device",
    "environment.device_name",
    "environment.versions",
    "environment.flags",
    "recipe.model.config_fingerprint",
    "recipe.model.num_layers",
    "recipe.model.hidden_size",
)


def live_fingerprint(model: Any) -> dict[str, Any]:
    """Provenance-shaped dict of what this loaded model computes with (kernels bound, dtype, device, ...)."""
    import torch

    from hsstore.capture.model.environment import device_info, flags, versions
    from hsstore.capture.model.kernels import bound_kernels
    from hsstore.capture.model.spec import config_fingerprint, text_config
    from hsstore.core.dtypes import name_of

    p = next(model.parameters())
    tc = text_config(model.config)
    dev = str(p.device) if p.device.type != "cuda" else f"cuda:{p.device.index or 0}"
    env = {
        **device_info(dev),
        "dtype": name_of(p.dtype),
        "kernels": bound_kernels(model),
        "versions": versions(),
        "flags": flags(),
    }
    env.pop("device_index", None)
    _ = torch  # imported for device_info's CUDA queries
    return {
        "recipe": {
            "model": {
                "config_fingerprint": config_fingerprint(model.config),
                "num_layers": int(tc.num_hidden_layers),
                "hidden_size": int(tc.hidden_size),
            }
        },
        "environment": env,
    }


def _restrict(prov: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    flat = flatten(prov)
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if any(k == f or k.startswith(f + ".") for f in fields):
            node = out
            parts = k.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = v
    return out


def check_live_model(model: Any, required: Any, allow_drift: Iterable[str] = ()) -> LiveFingerprint:
    """Raise ProvenanceMismatch if ``model`` would compute states other than ``required``'s
    (a provenance dict, a dataset, or 'STORE#SELECTOR'). Returns the live fingerprint it was checked on."""
    from hsstore.read.dataset import resolve_provenance

    want = _restrict(resolve_provenance(required), LIVE_FIELDS)
    have = _restrict(live_fingerprint(model), LIVE_FIELDS)
    require_match(have, want, allow_drift, what="live model")
    return LiveFingerprint.from_dict(have, "the live model's fingerprint")

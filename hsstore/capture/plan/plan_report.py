"""Assembles ``hsstore plan``'s report (hsstore.core.schema.plan.PlanReport): inputs, sizes, calibration,
space and time. Time is forward time: the FLOPs of the batches still to run at the calibration's measured
rate, else at an assumed MFU of the device's peak (hsstore.core.flops); the build's writing adds to it."""

from __future__ import annotations

from typing import Any, TypedDict

from hsstore.capture.plan.plan_sizes import (
    Measured,
    Run,
    VariantSize,
    batch_shapes,
    counts,
    sampled_rows,
    size_variant,
    sizes,
    space,
    tokens_of,
)
from hsstore.core.errors import BadInput
from hsstore.core.flops import ASSUMED_MFU, ForwardShape, batch_flops, mfu, peak_flops, seconds_at
from hsstore.core.schema.plan import FormSize, GenerationPlan, PlanReport, Ratio, Tokens, VariantPlan
from hsstore.core.schema.record import or_none, present
from hsstore.storage.sizing import FORMS

DEFAULT_GPU = "H200"  # whose peak an uncalibrated plan of a cuda build assumes when no GPU is visible here
# an uncalibrated plan runs up to PROBE_TOKENS of its own samples through a model this small to measure the
# codec ratios (loading it takes seconds on a CPU); larger models are planned on stated assumptions
PROBE_MAX_PARAMS = 100_000_000
PROBE_TOKENS = 4096  # the probe's states: samples from the middle of the plan, up to this many tokens
CALIBRATED_ERROR = (
    0.02  # bytes calibrated on every batch, against the build (tests/capture/test_plan_report.py TOLERANCE)
)
PROBE_ERROR = 0.10  # bytes from a probe or a calibration on some batches (tests/capture/test_plan_report.py)


def _peak(device: str, dtype: str, cal: Any, peak_tflops: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s, which device it is of) for a run on ``device``."""
    if peak_tflops:
        return peak_tflops * 1e12, f"--peak-tflops {peak_tflops:g}"
    if cal is not None and device.startswith("cuda"):
        return peak_flops(cal.device_name, dtype), cal.device_name
    if not device.startswith("cuda"):
        return None, device
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else DEFAULT_GPU
    why = (
        name
        if torch.cuda.is_available()
        else f"an {DEFAULT_GPU}, assumed: no GPU is visible here (--peak-tflops sets it)"
    )
    return peak_flops(name, dtype), why


def _timing(
    v: VariantSize, shape: ForwardShape, lengths: list[int], cal: Any, scale: float, peak_tflops: float | None
) -> dict[str, Any]:
    """FLOPs of the forwards ``v`` still runs, their seconds, MFU and tokens/s, and where those come from."""
    flops = batch_flops(shape, batch_shapes(lengths, v.remaining_batches)) * scale
    peak, where = _peak(v.run.device, v.run.dtype, cal, peak_tflops)
    if cal is not None and cal.seconds > 0:
        done = batch_flops(shape, cal.shapes)
        used = mfu(done, cal.seconds, peak) if peak else None
        tokens = sum(lengths[i] for b in v.remaining_batches for i in b) * scale
        encode = cal.encode_seconds.get(v.form.form, 0.0)
        secs = flops * cal.seconds / done + tokens * encode / max(1, cal.tokens)
        return {
            "flops": flops,
            "seconds": secs,
            "mfu": used,
            "tokens_per_second": cal.tokens / (cal.seconds + encode),
            "seconds_source": f"measured: {cal.tokens:,} tokens in {cal.seconds:.3g} s of forward + {encode:.3g} s "
            f"encoding {v.form.form} on {cal.device_name} ({len(cal.shapes)} timed batch(es) "
            f"after a warm-up; MFU {'n/a: no peak known' if used is None else f'{used:.2f}'})",
        }
    if peak is None:
        return {
            "flops": flops,
            "seconds": None,
            "mfu": None,
            "tokens_per_second": None,
            "seconds_source": f"unknown: no peak FLOP/s for {where}; run with --calibrate N (or --peak-tflops)",
        }
    secs = seconds_at(flops, peak, ASSUMED_MFU)
    tokens = sum(lengths[i] for b in v.remaining_batches for i in b) * scale
    return {
        "flops": flops,
        "seconds": secs,
        "mfu": ASSUMED_MFU,
        "tokens_per_second": tokens / secs if secs else None,
        "seconds_source": f"assumed: MFU {ASSUMED_MFU} (27B-shaped bare forward on an H200, docs/benchmarks.md) "
        f"of the {peak / 1e12:g} TFLOP/s {v.run.dtype} peak of {where}; forward only",
    }


def _variant(v: VariantSize, tokens: Tokens, timing: dict[str, Any], scale: float) -> VariantPlan:
    """The report's record of one variant's size, committed share and time."""
    return VariantPlan(
        backend=v.run.backend,
        dtype=v.run.dtype,
        device=v.run.device,
        form=v.form.form,
        codec=v.form.codec,
        samples=tokens.samples,
        tokens=tokens.tokens,
        units=max(1, round(v.units * scale)),
        bytes=v.bytes,
        bytes_per_layer=_layers(v.parts),
        token_bytes=v.parts["tokens"],
        ratio=_ratio(v),
        committed_variant=v.committed.variant,
        committed_samples=round(v.committed.samples * scale),
        committed_tokens=round(v.committed_tokens * scale),
        remaining_bytes=v.remaining_bytes,
        **timing,
    )


def _forms(m: Any, inp: Any, measured: dict[str, dict[str, Measured]], scale: float) -> list[FormSize]:
    """The whole sample set stored in each form with the manifest's codec: the choices side by side,
    measured on the form's own dtype's calibration (or probe) states, else the store's variants of the
    form, else the first dtype's (bf16 states cast to fp32 compress as no fp32 states do, so a dtype not
    built is best calibrated by building it)."""
    from hsstore.capture.plan.plan_sizes import NOTHING, on_disk
    from hsstore.core.batching import token_budget_batches
    from hsstore.storage.sizing import StoredForm

    lengths, keys = [s.length for s in inp.samples], [s.key for s in inp.samples]
    batches = token_budget_batches(lengths, m.token_budget)
    geometry = (int(inp.recipe.model.hidden_size), inp.recipe.layers.all)
    stored = on_disk(m, inp)
    out = []
    for name in FORMS:
        fp8 = name == "fp8-e4m3"
        run = Run("", "bf16" if fp8 else name, "", name if fp8 else None)
        codec = StoredForm.of(run.dtype, run.precision, m.codec).codec
        found = (
            measured.get(name, {}).get(name)
            or stored.get((name, codec))
            or (measured.get(m.dtypes[0], {}).get(name) if measured else None)
        )
        v = size_variant(m, run, lengths, keys, batches, geometry, NOTHING, found, scale)
        out.append(
            FormSize(form=name, codec=v.form.codec, bytes=v.bytes, bytes_per_layer=_layers(v.parts), ratio=_ratio(v))
        )
    return out


def _ratio(v: VariantSize) -> Ratio:
    return Ratio(value=v.ratio, source=v.ratio_source, measured=v.measured, expected_error=v.ratio_error)


def _measured(c: Any, n_batches: int) -> dict[str, Measured]:
    """A calibration's ratios per form, with its source and expected error (every batch: TOLERANCE of
    tests/capture/test_plan_report.py; fewer: as a probe's)."""
    every = c.batches >= n_batches
    source = (
        f"measured on {c.dtype} states of {'every one' if every else c.batches} of the plan's {n_batches} "
        "batch(es) (--calibrate)"
    )
    return {form: Measured(r, source, CALIBRATED_ERROR if every else PROBE_ERROR) for form, r in c.ratios.items()}


def probe_ratios(m: Any, inp: Any, shape: Any) -> dict[str, dict[str, Measured]]:
    """dtype -> form -> ratios of one batch of the plan run through the model in each dtype, when that is
    cheap (a model of at most PROBE_MAX_PARAMS parameters on a device present here) and the store holds
    no variant of the form that measures them as well; {} otherwise (the plan then assumes, and says so)."""
    from hsstore.capture.plan.calibrate import calibrate
    from hsstore.capture.plan.plan_sizes import on_disk
    from hsstore.core.batching import token_budget_batches
    from hsstore.storage.sizing import StoredForm

    device = m.devices[0]
    params = shape.sequence_flops(1) / 2  # a forward runs ~2 FLOPs per weight per token
    if params > PROBE_MAX_PARAMS or (device.startswith("cuda") and not _cuda()):
        return {}
    stored = on_disk(m, inp)
    have = {d: stored.get((m.precision or d, StoredForm.of(d, m.precision, m.codec).codec)) for d in m.dtypes}
    need = [d for d, x in have.items() if x is None or x.error > PROBE_ERROR]
    if not need or m.codec == "none":
        return {}
    from hsstore.capture.model.kernels import bind_backend

    try:
        bind_backend(m.backends[0])
    except BadInput:
        return {}  # this process binds other kernels: the probe's states would not be the build's
    batches = token_budget_batches([s.length for s in inp.samples], m.token_budget)
    middle = [i for b in batches[len(batches) // 2 :] for i in b]
    probe = [i for k, i in enumerate(middle) if sum(inp.samples[j].length for j in middle[:k]) < PROBE_TOKENS]
    out = {}
    for d in need:
        c = calibrate(inp, [probe], 1, d, device, m.attn_implementation, m.codec, m.unit_tokens)
        source = (
            f"probed: {c.tokens:,} tokens of the plan's samples through the model in {d} (a model this "
            "small loads in seconds; --calibrate N measures more)"
        )
        out[d] = {form: Measured(r, source, PROBE_ERROR) for form, r in c.ratios.items()}
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _layers(parts: dict[str, int]) -> dict[str, int]:
    """Layer id -> bytes of a size's parts."""
    return {k[len("layer_") :]: b for k, b in parts.items() if k.startswith("layer_")}


def make_plan(
    m: Any, limit: int | None = None, sample: int | None = None, calibrate: int = 0, peak_tflops: float | None = None
) -> PlanReport:
    """The plan of building ``m`` (``sample``: tokenize that many seeded rows, not all; ``calibrate``:
    measure ratios and tokens/s on that many batches per dtype)."""
    from hsstore.capture.inputs.manifest_file import validate
    from hsstore.capture.model.spec import forward_shape
    from hsstore.capture.run.driver import plan_inputs
    from hsstore.core.batching import token_budget_batches

    m = validate(m)
    if sample is not None and limit is not None:
        raise BadInput("--sample and --limit do not combine: --limit plans the first N usable rows exactly")
    if calibrate:
        _check_calibration_device(m.devices[0])
        from hsstore.capture.model.kernels import bind_backend

        bind_backend(m.backends[0])  # before transformers loads a model module (tokenizing does not)
    rows, population = sampled_rows(m.data_files, sample) if sample else (None, None)
    inp = plan_inputs(m, limit, rows=rows, drawn=bool(calibrate))  # a plan draws weights only to calibrate
    tokens, scale = tokens_of(inp, population, m.generate.n if m.generate is not None else 1)
    cal = _calibrations(m, inp, calibrate)
    n_batches = len(token_budget_batches([s.length for s in inp.samples], m.token_budget))
    calibrated = {d: _measured(c, n_batches) for d, c in cal.items()}
    config = inp.spec.config(or_none(inp.recipe.tokenizer.vocab_size), drawn=False)
    shape = forward_shape(config, max(inp.recipe.layers.all), m.trust_remote_code)
    probed = {} if cal else probe_ratios(m, inp, shape)
    found = sizes(m, inp, calibrated, scale, probed)
    lengths = [s.length for s in inp.samples]
    variants = [
        _variant(v, tokens, _timing(v, shape, lengths, cal.get(v.run.dtype), scale, peak_tflops), scale) for v in found
    ]
    return PlanReport(
        manifest=m.source,
        store=m.store_path,
        model=m.model_path,
        hidden_size=present(inp.recipe.model.hidden_size, "recipe.model.hidden_size"),
        layers=inp.recipe.layers.all,
        inputs=counts(inp),
        tokens=tokens,
        flops_per_token=shape.sequence_flops(round(tokens.mean_length)) / max(1.0, tokens.mean_length),
        variants=variants,
        forms=_forms(m, inp, {**probed, **calibrated}, scale),
        space=space(m, found, tokens.samples),
        batches=len(token_budget_batches(lengths, m.token_budget)),
        calibration_batches=max((c.batches for c in cal.values()), default=0),
        generation=generation_plan(
            m, inp, rows, limit, calibrate, population / len(rows) if rows and population else 1.0
        ),
    )


def generation_plan(
    m: Any, inp: Any, rows: Any, limit: int | None, calibrate: int, scale: float = 1.0
) -> GenerationPlan | None:
    """Replies, generated tokens and time of regenerating the replies (None without [generate]); ``scale``: the
    rows of the data per row of ``rows`` (a --sample's), which the counts are multiplied by."""
    if m.generate is None:
        return None
    from hsstore.capture.generate.prompts import jobs_from_rows
    from hsstore.capture.inputs.tokenizing import InputReport, load_rows

    g = m.generate
    jobs = jobs_from_rows(load_rows(m.data_files) if rows is None else rows, m.data_format, g, InputReport(), limit)
    tok = inp.spec.tokenizer()  # loaded once: the prompts and the calibrating engine share it
    jobs, prompts = _prompts(m, tok, jobs)
    skip, reused, pending = _checkpointed(m, inp, tok, jobs, prompts)
    prompts = [p for k, p in enumerate(prompts) if k not in skip]  # the build batches only the replies it lacks
    replies = sum(len(j.turns) for j in jobs)
    most = pending * g.max_new_tokens
    # the samples' replies (a stand-in's: its last turn's, as long as the data's own), for every turn of a chain
    data = round(sum(int(s.loss_mask.sum()) for s in inp.samples) * replies / max(1, len(jobs)))
    expected = min(most, round(data * pending / replies)) if data and replies else most
    batches = _prompt_batches(prompts, scale, g.max_new_tokens, m.token_budget)
    later = _later_rounds(m, tok, [j for k, j in enumerate(jobs) if k not in skip], scale)
    expected_tokens = round(expected * scale)
    timing = _generation_time(m, inp, tok, prompts, batches, calibrate, expected_tokens, bool(reused and not pending))
    return GenerationPlan(
        engine=g.engine,
        prompts=round(len({(j.file, j.row) for j in jobs}) * scale),
        replies=round(replies * scale),
        checkpointed_replies=round(reused * scale),
        max_generated_tokens=round(most * scale),
        expected_generated_tokens=expected_tokens,
        batches=len(batches) + later,
        **timing,
    )


class _Timing(TypedDict):
    """GenerationPlan's timing fields (typed, so ``GenerationPlan(**timing)`` is checked)."""

    generated_tokens_per_second: float | None
    first_batch_extra_seconds: float | None
    calibration_prompts: int | None
    seconds: float | None
    seconds_source: str


def _untimed(seconds: float | None, source: str) -> _Timing:
    """Timing fields of a generation the plan does not run: ``seconds`` and why (``source``)."""
    return _Timing(
        generated_tokens_per_second=None,
        first_batch_extra_seconds=None,
        calibration_prompts=None,
        seconds=seconds,
        seconds_source=source,
    )


def _generation_time(
    m: Any,
    inp: Any,
    tok: Any,
    prompts: list[list[int]],
    batches: list[list[int]],
    calibrate: int,
    expected: int,
    done: bool,
) -> _Timing:
    """GenerationPlan's timing fields: 0 s when the store holds every reply (``done``), none (and why) where the
    plan does not time the generation, else the time of ``expected`` generated tokens at the rate measured on the
    build's first batch (``batches[0]`` of ``prompts``) generated here, plus its one-off seconds."""
    if done:
        return _untimed(0.0, "nothing to generate: the store holds every reply, checkpointed by an earlier build")
    if (why := _not_timed(m.generate.engine, calibrate, batches)) is not None:
        return _untimed(None, f"not estimated: {why}")
    first = [prompts[i] for i in batches[0]]
    rate, extra = _generation_rate(m, inp, tok, first)
    return _Timing(
        generated_tokens_per_second=rate,
        first_batch_extra_seconds=extra,
        calibration_prompts=len(first),
        seconds=expected / rate + extra,
        seconds_source=f"measured: the build's first batch ({len(first)} prompts) generated here, "
        f"cold then warm; the warm rate, plus the cold one-off {extra:.1f} s",
    )


def _checkpointed(m: Any, inp: Any, tok: Any, jobs: list[Any], prompts: list[list[int]]) -> tuple[set[int], int, int]:
    """(positions of ``jobs`` the build generates no first reply for, the replies of ``jobs`` the store holds, the
    replies still to generate): the build reuses what the store holds (``regenerate.Replay``, keyed as the build
    keys them): a whole chain's replies (one that the build drops at a turn generates no later one), and a chain's
    replies before its first missing one; and it generates a first reply once for chains of one first prompt
    (``prompts``) and reply index (the same reply: duplicate rows)."""
    from dataclasses import replace

    from hsstore.capture.generate.regenerate import Replay

    replay = Replay(m, tok, inp.regenerated.checkpointed)  # the replies the plan's samples were replayed from
    skip, reused, pending = set(), 0, 0
    first: set[tuple[tuple[int, ...], int]] = set()  # the first replies to generate: (prompt, reply index)
    for k, j in enumerate(jobs):
        chain = replace(j, replies=[], texts=[], prompt=[], dropped=None)  # (the plan's jobs stay as they were)
        if replay(chain):
            skip.add(k)
        else:
            pending += len(j.turns) - len(chain.replies)
            if not chain.replies:
                if (tuple(prompts[k]), j.index) in first:
                    skip.add(k)  # a duplicate's first reply: generated once, for the first of them
                    pending -= 1
                first.add((tuple(prompts[k]), j.index))
        reused += len(chain.replies)
    return skip, reused, pending


def _prompt_batches(prompts: list[list[int]], scale: float, max_new_tokens: int, budget: int) -> list[list[int]]:
    """The engine's batches (indices into ``prompts``) of the whole data: each prompt of a --sample stands for
    ``scale`` prompts (a batch holds as many prompts of a length in the sample as in the data)."""
    from hsstore.capture.generate.engines import prompt_batches

    every = [int(i / scale) for i in range(round(len(prompts) * scale))]
    return [[every[k] for k in b] for b in prompt_batches([len(prompts[i]) for i in every], max_new_tokens, budget)]


def _later_rounds(m: Any, tok: Any, jobs: list[Any], scale: float) -> int:
    """The engine's batches after the first turn's (``turns = "all"`` regenerates round by round, a turn a round):
    each round's prompts with the earlier replies at most max_new_tokens (``prompts.capped_history``)."""
    from hsstore.capture.generate.prompts import capped_history, prompt_masker, rendered_prompt
    from hsstore.capture.inputs.messages import RowRejected

    g, masker, batches = m.generate, prompt_masker(tok, m.generate), 0
    for r in range(1, max((len(j.turns) for j in jobs), default=0)):
        prompts = []
        for j in (j for j in jobs if len(j.turns) > r):
            try:
                prompts.append(
                    rendered_prompt(masker, capped_history(tok, j, j.turns[r], g.max_new_tokens), j.tools, m.max_length)
                )
            except RowRejected:  # the build drops the chain at this turn
                continue
        batches += len(_prompt_batches(prompts, scale, g.max_new_tokens, m.token_budget))
    return batches


def _not_timed(engine: str, calibrate: int, batches: list[list[int]]) -> str | None:
    """Why the plan does not time the generation (None: it does)."""
    if not batches:
        return (
            "no prompts to calibrate on: no row gives a prompt the build would regenerate from (it refuses such data)"
        )
    if engine != "model":
        return f"the {engine} engine's server is not run by plan (its speed is the server's; time a batch against it)"
    if not calibrate:
        return 'pass --calibrate to generate one batch here (engine = "model")'
    return None


def _prompts(m: Any, tok: Any, jobs: list[Any]) -> tuple[list[Any], list[list[int]]]:
    """The jobs the build generates and their prompt tokens, as the build renders them (their lengths form the
    engine's batches): the build drops a job whose prompt holds max_length tokens or more."""
    from hsstore.capture.generate.prompts import prompt_masker, prompt_tokens
    from hsstore.capture.inputs.messages import RowRejected

    masker = prompt_masker(tok, m.generate)
    kept, prompts = [], []
    for j in jobs:
        try:
            prompts.append(prompt_tokens(masker, j, m.max_length))
        except RowRejected:
            continue
        kept.append(j)
    return kept, prompts


def _generation_rate(m: Any, inp: Any, tok: Any, batch: list[list[int]]) -> tuple[float, float]:
    """(generated tokens per second, one-off seconds) of ``batch`` generated here by the target twice: the first
    generation in a process pays one-off costs (on an H100, 2.5x a warm one), which a build pays once."""
    import time

    from hsstore.capture.generate.engines import LocalEngine
    from hsstore.core.dtypes import TORCH

    engine = LocalEngine(
        inp.spec.load(TORCH[m.dtypes[0]], m.devices[0], m.attn_implementation), tok, inp.pad_id, m.token_budget
    )
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = engine.batch(batch, m.generate, list(range(m.generate.seed, m.generate.seed + len(batch))))
        times.append(max(time.perf_counter() - t0, 1e-9))
    return sum(len(o.ids) for o in out) / times[1], max(0.0, times[0] - times[1])


def _check_calibration_device(device: str) -> None:
    """BadInput when calibration would run on a GPU this machine does not have."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise BadInput(
                f"--calibrate runs the model on {device!r}, but no CUDA GPU is visible here; plan without "
                "--calibrate (stated assumptions), calibrate on the GPU host, or pass --device cpu"
            )


def _calibrations(m: Any, inp: Any, n: int) -> dict[str, Any]:
    """dtype -> Calibration on the first ``n`` batches of the build's plan (first backend and device)."""
    if not n:
        return {}
    from hsstore.capture.plan.calibrate import calibrate
    from hsstore.core.batching import token_budget_batches

    batches = token_budget_batches([s.length for s in inp.samples], m.token_budget)
    return {
        d: calibrate(inp, batches, n, d, m.devices[0], m.attn_implementation, m.codec, m.unit_tokens) for d in m.dtypes
    }

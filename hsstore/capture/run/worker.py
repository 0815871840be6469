"""The build worker: one fresh process per backend. Loads the model with that backend forced, then
runs the capture pipeline over its share of samples for each (dtype, device).

Run as ``python -m hsstore.capture.run.worker PLAN.json`` (a WorkerPlan); writes a WorkerOutcome to the
plan's ``result`` path. It exits by itself when the driver that started it is gone
(hsstore.capture.run.signals), so a killed build never leaves a worker computing.

``run(plan)`` is the whole worker but for the process around it: the driver calls it inline
(``build(..., inline=True)``) where the process already binds the plan's backend (tests, Python callers).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsstore.core.schema.build import VariantResult, WorkerOutcome, WorkerPlan
from hsstore.core.schema.provenance import Batching, Kernels, ModelParallel, Provenance, Stage, Storage
from hsstore.core.schema.record import present

if TYPE_CHECKING:
    from hsstore.core.keys import SampleTokens

# pinned host buffers allocated while the model loads, in units: one unit copying while one is written
# (more are allocated on demand when the writers fall behind)
RESERVED_UNITS = 2


@dataclass(frozen=True)
class Geometry:
    """The sizes one variant's capture is planned with."""

    hidden: int
    itemsize: int  # bytes per stored value
    layers: list[int]  # every captured layer id, ascending
    unit_tokens: int

    @classmethod
    def of(cls, plan: WorkerPlan, dtype: str) -> Geometry:
        from hsstore.core.batching import default_unit_tokens
        from hsstore.core.dtypes import STORED

        hidden = present(plan.recipe.model.hidden_size, "recipe.model.hidden_size")
        itemsize = 1 if plan.precision else STORED[dtype].itemsize  # fp8 codes: one byte
        layers = plan.recipe.layers.all
        unit_tokens = plan.unit_tokens or default_unit_tokens(hidden, itemsize, len(layers))
        return cls(hidden, itemsize, layers, unit_tokens)


def _reserve_pinned(plan: WorkerPlan, g: Geometry, devices: list[str]) -> Any:
    """On CUDA: bind our GPU and start pinning the first units' host buffers while the model loads."""
    import torch

    from hsstore.capture.run.pipeline import PINNED_POOL

    if not devices[0].startswith("cuda"):
        return None
    torch.cuda.set_device(devices[0])  # kernels that launch on the current device land on ours
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    # a unit flushes once it reaches unit_tokens, so one layer's part is under unit_tokens + one batch
    layer_bytes = (g.unit_tokens + plan.token_budget) * g.hidden * g.itemsize
    return PINNED_POOL.reserve_in_background([layer_bytes] * len(g.layers) * RESERVED_UNITS, devices[0])


def _load(plan: WorkerPlan, spec: Any, dtype: str, devices: list[str]) -> tuple[Any, Kernels]:
    """The model, checked to be the hashed weights and to run the requested backend's kernels."""
    from hsstore.capture.model.kernels import bound_kernels, fla_off_device, why_not
    from hsstore.core.dtypes import TORCH
    from hsstore.core.errors import BadInput, BuildFailed

    model = spec.load(TORCH[dtype], devices, plan.attn_implementation)
    spec.check_unchanged(plan.weight_stamps)  # the loaded bytes are the hashed ones
    kernels = Kernels(**bound_kernels(model))
    if plan.backend == "fla" and kernels.chunk_gated_delta_rule not in ("fla", "n/a"):
        if off := fla_off_device(model):
            raise BadInput(f"backend 'fla' was requested, but {off}")
        raise BuildFailed(
            f"backend 'fla' was requested but transformers bound {kernels.chunk_gated_delta_rule!r} "
            f"for the gated delta rule; {why_not(model, 'fla')}"
        )
    return model, kernels


def planned_provenance(
    recipe: Any,
    token_budget: int,
    precision: str | None,
    backend: str,
    dtype: str,
    device: str,
    kernels: Kernels,
    probe: bool = True,
) -> Provenance:
    """The provenance a variant of ``recipe`` computed on ``device`` gets (``hsstore plan`` calls it with
    kernels not yet known and ``probe=False``: a plan matches store variants on every other field)."""
    from hsstore.capture.model.environment import environment
    from hsstore.core.batching import POLICY as PADDING_POLICY
    from hsstore.core.precision_names import SCALE_SCHEME

    batching = Batching(
        padding_side="right",
        token_budget=token_budget,
        attention_mask=True,
        order="length-descending",
        padded_lengths=PADDING_POLICY,
    )
    env = environment(device, dtype, backend, kernels, batching, probe)
    if precision:  # absent when stored as computed: the ids of such variants do not change
        env = env.replace(storage=Storage(precision=precision, scale=SCALE_SCHEME))
    return Provenance(recipe=recipe, environment=env)


def _provenance(plan: WorkerPlan, model: Any, dtype: str, devices: list[str], kernels: Kernels) -> Provenance:
    prov = planned_provenance(plan.recipe, plan.token_budget, plan.precision, plan.backend, dtype, devices[0], kernels)
    if len(devices) > 1:
        mp = model_parallel(model, present(plan.recipe.model.num_layers, "recipe.model.num_layers"), devices)
        prov = prov.replace(environment=prov.environment.replace(model_parallel=mp))
    return prov


def _open_variant(plan: WorkerPlan, provenance: Provenance, g: Geometry, dtype: str) -> tuple[str, Any]:
    """Create (or find) the variant; returns its id and a writer with a fresh unique id."""
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.storage.store import Store
    from hsstore.storage.writer import UnitWriter

    store = Store.create(plan.store)
    from hsstore.core.precision_names import codec_for_codes
    from hsstore.storage.codecs import kept_codec_note
    from hsstore.storage.names import another_model_allowed

    codec = codec_for_codes(plan.codec) if plan.precision else plan.codec
    with another_model_allowed(plan.another_model):
        vid = store.create_variant(
            provenance.to_dict(),
            plan.recipe.layers.to_dict(),
            g.hidden,
            dtype,
            codec,
            chunk_tokens(g.hidden, g.itemsize),
            precision=plan.precision,
        )
    if plan.label:  # before any state is computed: a label another variant holds stops the build here
        store.set_label(vid, plan.label, by="build")
    kept = store.variant_record(vid).codec
    if kept != codec:  # a codec changes no number: no new variant, and the existing one keeps its own
        print(kept_codec_note(vid, kept, codec), file=sys.stderr, flush=True)
    with open(plan.progress, "a") as f:  # the driver names it if the build is stopped
        f.write(vid + "\n")
    # unique per process (two builds started in the same millisecond once shared a time-based id)
    writer = UnitWriter(
        store, vid, writer_id=f"{plan.writer_prefix}{uuid.uuid4().hex[:12]}", check_health=not plan.allow_unhealthy
    )
    return vid, writer


def run_variant(plan: WorkerPlan, spec: Any, samples: list[SampleTokens], dtype: str, device: str) -> VariantResult:
    """Load the model for (dtype, device), compute every batch with an uncommitted sample, write units."""
    import torch

    from hsstore.capture.run.pipeline import capture_to_store
    from hsstore.capture.run.progress import Progress, status

    t0 = time.time()
    torch.manual_seed(0)
    g = Geometry.of(plan, dtype)
    devices = device.split("+")  # several: one model spread over a group of GPUs
    reservation = _reserve_pinned(plan, g, devices)
    status(f"{plan.backend}/{dtype}/{device}: loading the model", plan.quiet or plan.writer_prefix != "r0-")
    model, kernels = _load(plan, spec, dtype, devices)
    vid, writer = _open_variant(plan, _provenance(plan, model, dtype, devices, kernels), g, dtype)
    done = set(writer.committed_keys())
    batches, tokens = _left(plan, samples, done)
    progress = Progress(f"{vid} {plan.backend}/{dtype}/{device}", sum(map(len, batches)), tokens, plan.quiet)
    reserved = reservation.wait() if reservation is not None else {}
    out = capture_to_store(
        model,
        present(plan.recipe.model.num_layers, "recipe.model.num_layers"),
        g.layers,
        samples,
        batches,
        writer,
        devices[0],
        plan.pad_id,
        g.unit_tokens,
        skip=done,
        progress=progress,
        precision=plan.precision,
    )
    pending = {samples[i].key for b in batches for i in b} - done
    return VariantResult(
        variant=vid,
        backend=plan.backend,
        dtype=dtype,
        device=device,
        kernels=kernels,
        samples_present=sum(1 for s in samples if s.key in done),
        samples_by_others=len(pending & writer.committed_keys()) - out.samples_written,
        tokens=tokens,
        seconds=time.time() - t0,
        tokens_per_second=tokens / out.loop_seconds if out.loop_seconds > 0 and tokens else None,
        peak_gpu_memory_gb=_peak_gpu_memory_gb(devices),
        **out.to_dict(),  # what the capture loop wrote and where its time went, as it measured them
        **reserved,
    )


def _left(plan: WorkerPlan, samples: list[SampleTokens], done: set[str]) -> tuple[list[list[int]], int]:
    """The driver's batches that hold a sample not yet committed, and their tokens. The batch plan is kept as is
    (bit-identical states on resume): finished batches are skipped, none is rebatched."""
    batches = [b for b in plan.batches if any(samples[i].key not in done for i in b)]
    return batches, sum(samples[i].length for b in batches for i in b)


def _peak_gpu_memory_gb(devices: list[str]) -> dict[str, float]:
    """GB each CUDA device of ``devices`` held at most since ``_reserve_pinned`` reset its peak."""
    import torch

    return {d: round(torch.cuda.max_memory_allocated(d) / 1e9, 2) for d in devices if d.startswith("cuda")}


def model_parallel(model: Any, num_layers: int, devices: list[str]) -> ModelParallel:
    """Where the layers of a model spread over a GPU group really are (informational: each layer runs
    whole on one GPU, and the driver allows only one kind of GPU in a group)."""
    from hsstore.capture.model.placement import decoder_layers, stages

    layer_devices = [str(next(layer.parameters()).device) for layer in decoder_layers(model, num_layers)]
    return ModelParallel(devices=devices, stages=[Stage(**s) for s in stages(layer_devices)])


def _outcome(plan: WorkerPlan) -> WorkerOutcome:
    """Run every (dtype, device) of the plan; an error becomes the outcome (exit code 2 for bad input)."""
    from hsstore.core.errors import HsstoreError

    try:
        from hsstore.capture.model.kernels import bind_backend

        bind_backend(plan.backend)  # before transformers is imported (inline: checks what is bound)
        from hsstore.capture.inputs.datafiles import load_samples
        from hsstore.capture.model.spec import ModelSpec

        spec = ModelSpec(**plan.model.to_dict())
        samples = load_samples(plan.samples_file)
        return WorkerOutcome(results=[run_variant(plan, spec, samples, dtype, device) for dtype, device in plan.runs])
    except HsstoreError as e:
        return WorkerOutcome(error=str(e), exit_code=e.exit_code)
    except Exception as e:  # noqa: BLE001 - reported to the driver through the result file
        import traceback

        traceback.print_exc()
        return WorkerOutcome(error=f"{type(e).__name__}: {e}", exit_code=1)


def run(plan: WorkerPlan) -> int:
    """Run the plan and write its outcome to the plan's ``result`` path: the worker's exit code. The worker
    process runs this; so does the driver itself with ``inline=True``."""
    outcome = _outcome(plan)
    Path(plan.result).write_text(json.dumps(outcome.to_dict()))
    return outcome.exit_code


def main(argv: list[str]) -> int:
    from hsstore.capture.run.signals import exit_with_parent

    plan = WorkerPlan.from_json(Path(argv[0]).read_bytes(), f"worker plan {argv[0]}")
    exit_with_parent(plan.parent_pid, Path(argv[0]).parent)  # never outlive the driver
    return run(plan)


if __name__ == "__main__":
    from hsstore.core.interrupt import end_process

    end_process(main(sys.argv[1:]))  # its outcome is in the result file: no teardown of torch and transformers

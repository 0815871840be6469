"""The build worker: one fresh process per backend. Loads the model with that backend forced, then
runs the capture pipeline over its share of samples for each (dtype, device).

Run as ``python -m hsstore.build.worker PLAN.json``; writes ``RESULT.json`` (path in the plan).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any


# a unit (one writer's atomic piece of work) holds about this many bytes of states: large enough that
# per-unit costs vanish, small enough that the pinned host buffers in flight and the work lost to a
# crash stay bounded (a 27B target: ~20k tokens of 5 layers x 5120 x bf16)
UNIT_BYTES = 1 << 30
# pinned host buffers allocated while the model loads, in units: one unit copying while one is written
# (more are allocated on demand when the writers fall behind)
RESERVED_UNITS = 2


def _fail(result_path: str, exc: BaseException) -> int:
    from hsstore.core.errors import HsstoreError

    code = exc.exit_code if isinstance(exc, HsstoreError) else 1
    msg = str(exc) if isinstance(exc, HsstoreError) else f"{type(exc).__name__}: {exc}"
    with open(result_path, "w") as f:
        json.dump({"error": msg, "exit_code": code}, f)
    return code


def run_variant(plan: dict[str, Any], model_spec: Any, samples: list, dtype: str, device: str) -> dict[str, Any]:
    import torch

    from hsstore.build.backends import bound_kernels
    from hsstore.build.pipeline import PINNED_POOL, capture_to_store
    from hsstore.core.batching import POLICY as PADDING_POLICY
    from hsstore.core.dtypes import STORED, TORCH
    from hsstore.core.quant import SCALE_SCHEME
    from hsstore.build.environment import environment
    from hsstore.core.errors import BuildFailed
    from hsstore.core.schema.files import FileStamp
    from hsstore.build.progress import Progress
    from hsstore.storage.store import Store
    from hsstore.storage.writer import UnitWriter

    t0 = time.time()
    torch.manual_seed(0)
    rec = plan["recipe"]
    hidden = rec["model"]["hidden_size"]
    precision = plan.get("precision")  # None: stored as computed; "fp8-e4m3": quantized on the device
    itemsize = 1 if precision else STORED[dtype].itemsize
    layers = sorted({i for ids in rec["layers"].values() for i in ids})
    unit_tokens = plan["unit_tokens"] or max(1, UNIT_BYTES // (hidden * itemsize * len(layers)))
    devices = device.split("+")  # several: one model spread over a group of GPUs
    reservation = None
    if devices[0].startswith("cuda"):
        torch.cuda.set_device(devices[0])  # kernels that launch on the current device land on ours
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
        # a unit flushes once it reaches unit_tokens, so one layer's part is under unit_tokens + one batch
        layer_bytes = (unit_tokens + plan["token_budget"]) * hidden * itemsize
        reservation = PINNED_POOL.reserve_in_background([layer_bytes] * len(layers) * RESERVED_UNITS, devices[0])
    model = model_spec.load(TORCH[dtype], devices, plan["attn_implementation"])
    model_spec.check_unchanged({n: FileStamp.from_dict(st, "weight stamp") for n, st in plan["weight_stamps"].items()})
    kernels = bound_kernels(model)
    if plan["backend"] == "fla" and kernels["chunk_gated_delta_rule"] not in ("fla", "n/a"):
        raise BuildFailed(f"backend 'fla' was requested but transformers bound {kernels['chunk_gated_delta_rule']!r} "
                          "for the gated delta rule; check the fla installation (`hsstore env --model ...`)")
    batching = {"padding_side": "right", "token_budget": plan["token_budget"], "attention_mask": True,
                "order": "length-descending", "padded_lengths": PADDING_POLICY}
    env = environment(devices[0], dtype, plan["backend"], kernels, batching)
    if precision:  # absent when stored as computed: the ids of such variants do not change
        env["storage"] = {"precision": precision, "scale": SCALE_SCHEME}
    if len(devices) > 1:
        env["model_parallel"] = model_parallel(model, rec["model"]["num_layers"], devices)
    provenance = {"recipe": rec, "environment": env}
    store = Store.create(plan["store"])
    from hsstore.storage.codecs import chunk_tokens

    vid = store.create_variant(provenance, rec["layers"], hidden, dtype, plan["codec"], chunk_tokens(hidden, itemsize))
    # unique per process (two builds started in the same millisecond once shared a time-based id)
    writer = UnitWriter(store, vid, writer_id=f"{plan['writer_prefix']}{uuid.uuid4().hex[:12]}",
                          check_health=not plan["allow_unhealthy"])
    done = set(writer.committed_keys())
    # the driver's batch plan is kept as is (bit-identical states on resume); finished batches are skipped
    batches = [b for b in plan["batches"] if any(samples[i].key not in done for i in b)]
    skipped = sum(1 for s in samples if s.key in done)
    total_tokens = sum(samples[i].length for b in batches for i in b)
    progress = Progress(f"{vid} {plan['backend']}/{dtype}/{device}", sum(map(len, batches)), total_tokens,
                        plan.get("quiet", False))
    reserved = reservation.wait() if reservation is not None else {}
    out = capture_to_store(model, rec["model"]["num_layers"], layers, samples, batches, writer, devices[0],
                           plan["pad_id"], unit_tokens, skip=done, progress=progress, precision=precision)
    loop_s = out["loop_seconds"]
    return {
        "variant": vid, "backend": plan["backend"], "dtype": dtype, "device": device, "kernels": kernels,
        "samples_written": out["samples_written"], "samples_present": skipped, "tokens": total_tokens,
        "bytes": out["bytes"], "seconds": time.time() - t0, "loop_seconds": loop_s,
        "writer_busy_seconds": out["writer_busy_seconds"], "first_batch_seconds": out["first_batch_seconds"],
        "tail_seconds": out["tail_seconds"], "pinned_alloc_seconds": out["pinned_alloc_seconds"],
        "batch_shapes": out["batch_shapes"],
        "steady_tokens": out["steady_tokens"], "steady_seconds": out["steady_seconds"], **reserved,
        "tokens_per_second": total_tokens / loop_s if loop_s > 0 and total_tokens else None,
        "peak_gpu_memory_gb": {d: round(torch.cuda.max_memory_allocated(d) / 1e9, 2)
                               for d in devices if d.startswith("cuda")},
    }


def model_parallel(model: Any, num_layers: int, devices: list[str]) -> dict[str, Any]:
    """Where the layers of a model spread over a GPU group really are (informational: each layer runs
    whole on one GPU, and the driver allows only one kind of GPU in a group)."""
    from hsstore.build.capture import decoder_layers
    from hsstore.build.placement import stages

    layer_devices = [str(next(layer.parameters()).device) for layer in decoder_layers(model, num_layers)]
    return {"devices": devices, "stages": stages(layer_devices)}


def main(argv: list[str]) -> int:
    plan_path = argv[0]
    with open(plan_path) as f:
        plan = json.load(f)
    try:
        from hsstore.build.backends import force_backend

        force_backend(plan["backend"])  # before transformers is imported
        from hsstore.build.models import ModelSpec
        from hsstore.build.samples_file import load_samples

        spec = ModelSpec(**plan["model_spec"])
        samples = load_samples(plan["samples_file"])
        results = [run_variant(plan, spec, samples, dtype, device) for dtype, device in plan["runs"]]
    except BaseException as e:  # noqa: BLE001 - reported to the driver through the result file
        if isinstance(e, KeyboardInterrupt):
            raise
        if not isinstance(e, Exception):
            raise
        from hsstore.core.errors import HsstoreError

        if not isinstance(e, HsstoreError):
            import traceback

            traceback.print_exc()
        return _fail(plan["result"], e)
    with open(plan["result"], "w") as f:
        json.dump({"results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The build worker: one fresh process per backend. Loads the model with that backend forced, captures
the layers of its share of samples for each (dtype, device), and writes units on a background thread.

Run as ``python -m hsstore.worker PLAN.json``; writes ``RESULT.json`` (path in the plan).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any


def _fail(result_path: str, exc: BaseException) -> int:
    from .errors import HsstoreError

    code = exc.exit_code if isinstance(exc, HsstoreError) else 1
    msg = str(exc) if isinstance(exc, HsstoreError) else f"{type(exc).__name__}: {exc}"
    with open(result_path, "w") as f:
        json.dump({"error": msg, "exit_code": code}, f)
    return code


class BackgroundWriter:
    """Writes units on a thread so compression and disk overlap the next forward; bounded queue."""

    def __init__(self, writer: Any, depth: int = 2) -> None:
        self.writer = writer
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.written = 0
        self.bytes = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            samples, states, event = item
            if self.error is not None:
                continue
            try:
                if event is not None:
                    event.synchronize()  # the async device-to-host copies have landed
                commit = self.writer.write(samples, states)
                if commit is not None:
                    self.written += len(commit.samples)
                    self.bytes += sum(commit.files.values())
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                self.error = e

    def put(self, samples: list, states: dict, event: Any) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((samples, states, event))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def run_variant(plan: dict[str, Any], model_spec: Any, samples: list, dtype: str, device: str) -> dict[str, Any]:
    import torch

    from .backends import bound_kernels
    from .batching import token_budget_batches
    from .capture import LayerCapture, pad_batch
    from .dtypes import TORCH
    from .environment import environment
    from .errors import BuildFailed
    from .progress import Progress
    from .store import Store

    t0 = time.time()
    torch.manual_seed(0)
    model = model_spec.load(TORCH[dtype], device, plan["attn_implementation"])
    kernels = bound_kernels(model)
    if plan["backend"] == "fla" and kernels["chunk_gated_delta_rule"] not in ("fla", "n/a"):
        raise BuildFailed(f"backend 'fla' was requested but transformers bound {kernels['chunk_gated_delta_rule']!r} "
                          "for the gated delta rule; check the fla installation (`hsstore env --model ...`)")
    batching = {"padding_side": "right", "token_budget": plan["token_budget"], "attention_mask": True,
                "order": "length-descending"}
    env = environment(device, dtype, plan["backend"], kernels, batching)
    provenance = {"recipe": plan["recipe"], "environment": env}
    store = Store.create(plan["store"])
    rec = plan["recipe"]
    hidden = rec["model"]["hidden_size"]
    itemsize = 4 if dtype == "fp32" else 2
    from .codecs import chunk_tokens

    vid = store.create_variant(provenance, rec["layers"], hidden, dtype, plan["codec"], chunk_tokens(hidden, itemsize))
    writer = store.writer(vid, writer_id=f"{plan['writer_prefix']}{int(time.time() * 1000):x}",
                          check_health=not plan["allow_unhealthy"])
    done = writer.committed_keys()
    todo = [s for s in samples if s.key not in done]
    skipped = len(samples) - len(todo)
    layers = sorted({i for ids in rec["layers"].values() for i in ids})
    cap = LayerCapture(model, rec["model"]["num_layers"], layers)
    bg = BackgroundWriter(writer)
    pinned = device.startswith("cuda")
    batches = token_budget_batches([s.length for s in todo], plan["token_budget"])
    total_tokens = sum(s.length for s in todo)
    progress = Progress(f"{vid} {plan['backend']}/{dtype}/{device}", len(todo), total_tokens, plan.get("quiet", False))
    unit_samples: list = []
    unit_states: dict[int, list] = {i: [] for i in layers}
    unit_tokens = 0
    forward_s = 0.0

    def flush() -> None:
        nonlocal unit_samples, unit_states, unit_tokens
        if not unit_samples:
            return
        states = {i: torch.cat(unit_states[i]) for i in layers}
        event = None
        if pinned:
            host = {i: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for i, t in states.items()}
            for i in layers:
                host[i].copy_(states[i], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            states = host
        bg.put(unit_samples, states, event)
        unit_samples, unit_states, unit_tokens = [], {i: [] for i in layers}, 0

    try:
        for batch in batches:
            seqs = [torch.from_numpy(todo[i].input_ids.astype("int64")) for i in batch]
            ids, mask = pad_batch(seqs, plan["pad_id"], device)
            f0 = time.time()
            out = cap.run(ids, mask)
            forward_s += time.time() - f0
            for b, i in enumerate(batch):
                n = todo[i].length
                for layer in layers:
                    unit_states[layer].append(out[layer][b, :n])
                unit_samples.append(todo[i])
                unit_tokens += n
            if unit_tokens >= plan["unit_tokens"]:
                flush()
            progress.advance(len(batch), sum(todo[i].length for i in batch))
        flush()
    finally:
        bg.close()
        cap.close()
        progress.close()
    return {
        "variant": vid, "backend": plan["backend"], "dtype": dtype, "device": device, "kernels": kernels,
        "samples_written": bg.written, "samples_present": skipped, "tokens": total_tokens,
        "bytes": bg.bytes, "seconds": time.time() - t0, "forward_seconds": forward_s,
    }


def main(argv: list[str]) -> int:
    plan_path = argv[0]
    with open(plan_path) as f:
        plan = json.load(f)
    try:
        from .backends import force_backend

        force_backend(plan["backend"])  # before transformers is imported
        from .models import ModelSpec
        from .samples_file import load_samples

        spec = ModelSpec(**plan["model_spec"])
        samples = load_samples(plan["samples_file"])
        results = [run_variant(plan, spec, samples, dtype, device) for dtype, device in plan["runs"]]
    except BaseException as e:  # noqa: BLE001 - reported to the driver through the result file
        if isinstance(e, KeyboardInterrupt):
            raise
        if not isinstance(e, Exception):
            raise
        from .errors import HsstoreError

        if not isinstance(e, HsstoreError):
            import traceback

            traceback.print_exc()
        return _fail(plan["result"], e)
    with open(plan["result"], "w") as f:
        json.dump({"results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

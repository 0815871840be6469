"""``hsstore build``: manifest -> tokens -> one worker process per backend -> variants in the store.

Under torchrun (WORLD_SIZE > 1) every rank tokenizes the same inputs deterministically, takes a
disjoint token-balanced share, binds its local GPU and writes its own units; rank 0 then checks that
every sample is committed and records the build as complete.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

from hsstore.storage import layout
from hsstore.core.errors import BadInput, BuildFailed
from hsstore.build.manifest import FINAL_NORM, Manifest, resolve_layers, validate
from hsstore.build.models import ModelSpec, text_config


def _dist() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _check_devices(m: Manifest, local_rank: int, world: int) -> list[str]:
    import torch

    from hsstore.build.backends import installed

    if "fla" in m.backends and not installed("fla"):
        raise BadInput("backend 'fla' needs the flash-linear-attention kernels, which are not installed here: "
                       "pip install flash-linear-attention fla-core (or use --backend torch)")
    out = []
    for dev in m.devices:
        if dev.startswith("cuda"):
            if not torch.cuda.is_available():
                raise BadInput(f"device {dev!r} requested but no CUDA GPU is visible here; use --device cpu")
            k, count = m.gpus_per_rank, torch.cuda.device_count()
            if k > 1:
                from hsstore.build.placement import require_accelerate

                require_accelerate()
                first = local_rank * k
                if first + k > count:
                    raise BadInput(f"gpus_per_rank = {k} on local rank {local_rank} needs GPUs {first}..{first + k - 1} "
                                   f"but {count} are visible: run at most {count // k} rank(s) per node "
                                   f"(torchrun --nproc-per-node {max(1, count // k)}) or lower gpus_per_rank")
                group = [f"cuda:{first + i}" for i in range(k)]
                names = {torch.cuda.get_device_name(d) for d in group}
                if len(names) > 1:
                    raise BadInput(f"the GPUs of one rank group differ ({', '.join(sorted(names))}); a model spread "
                                   "over GPUs must run on one kind of GPU — set CUDA_VISIBLE_DEVICES to GPUs of one model")
                dev = "+".join(group)
            elif dev == "cuda":
                dev = f"cuda:{local_rank % torch.cuda.device_count()}" if world > 1 else "cuda:0"
            elif int(dev[5:]) >= torch.cuda.device_count():
                raise BadInput(f"device {dev!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
        out.append(dev)
    return out


def plan_inputs(m: Manifest, limit: int | None) -> tuple[ModelSpec, dict[str, Any], dict[str, Any], list, Any, int]:
    """Validate the model and layers, tokenize the inputs, hash the weights. Returns (spec, recipe,
    weight stamps, samples, report, pad id)."""
    from hsstore.build.inputs import load_rows, tokenize_rows

    spec = ModelSpec(m.model_path, m.config_overrides, m.seed, m.trust_remote_code, m.init_device)
    spec.check()
    tok = spec.tokenizer()
    config = spec.config(len(tok))
    tc = text_config(config)
    n_layers = int(tc.num_hidden_layers)
    layers = resolve_layers(m.layers, n_layers, m.model_path)
    tok_id = spec.tokenizer_identity(tok)
    samples, report = tokenize_rows(load_rows(m.data_files), tok, tok_id.fingerprint, m.data_format,
                                    m.max_length, m.too_long, limit)
    weights = spec.hash_weights()  # every build: a variant only gets states of weights hashed for it
    recipe = {
        "model": spec.identity(config, weights).to_dict(),
        "tokenizer": tok_id.to_dict(),
        "layers": layers,
        "capture": "decoder_layer_output",  # layer i = raw output of decoder layer i (pre final norm)
        # layer num_layers, when listed, is the final norm's output (a named capture, see manifest.FINAL_NORM)
        "final_norm": any(i == FINAL_NORM for ids in m.layers.values() for i in ids),
        "max_length": m.max_length,
        "truncation": m.too_long,
    }
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    stamps = {n: h.stamp.to_dict() for n, h in weights.items()}
    return spec, recipe, stamps, samples, report, int(pad)


def _run_worker(plan: dict[str, Any], tmp: str, name: str) -> list[dict[str, Any]]:
    plan_path = os.path.join(tmp, f"{name}.plan.json")
    plan["result"] = os.path.join(tmp, f"{name}.result.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
              "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)  # the worker is a plain process, not a member of the process group
    proc = subprocess.run([sys.executable, "-m", "hsstore.build.worker", plan_path], env=env)
    try:
        with open(plan["result"]) as f:
            result = json.load(f)
    except (OSError, ValueError):
        raise BuildFailed(f"the {plan['backend']} worker died (exit {proc.returncode}) before reporting; "
                          "committed units are intact — re-run the same command to resume") from None
    if "error" in result:
        err = BadInput if result["exit_code"] == 2 else BuildFailed
        raise err(result["error"])
    return result["results"]


def build(m: Manifest, limit: int | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the whole build; returns the summary printed at the end."""
    from hsstore.storage.store import Store

    t0 = time.time()
    m = validate(m)
    rank, world, local_rank = _dist()
    devices = _check_devices(m, local_rank, world)
    spec, recipe, stamps, samples, report, pad_id = plan_inputs(m, limit)
    Store.create(m.store_path)  # fail early on a bad store path, before any model runs
    group = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        group = dist
    from hsstore.core.batching import token_budget_batches
    from hsstore.core.partition import balanced_by_tokens

    # One global batch plan, then whole batches per rank: a sample is always computed in the same
    # batch, so states are bit-identical whatever the world size or however often a build resumed.
    lengths = [s.length for s in samples]
    batches = token_budget_batches(lengths, m.token_budget)
    share = balanced_by_tokens([sum(lengths[i] for i in b) for b in batches], world)[rank]
    mine = [samples[i] for b in share for i in batches[b]]
    local_batches, pos = [], 0
    for b in share:
        local_batches.append(list(range(pos, pos + len(batches[b]))))
        pos += len(batches[b])
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hsstore-build-") as tmp:
            from hsstore.build.samples_file import save_samples

            samples_file = os.path.join(tmp, "samples.npz")
            save_samples(samples_file, mine)
            for backend in m.backends:
                plan = {
                    "backend": backend, "store": m.store_path, "recipe": recipe,
                    "weight_stamps": stamps,
                    "model_spec": asdict(spec), "samples_file": samples_file,
                    "runs": [(d, dev) for d in m.dtypes for dev in devices],
                    "attn_implementation": m.attn_implementation, "token_budget": m.token_budget,
                    "unit_tokens": m.unit_tokens, "codec": m.codec, "allow_unhealthy": m.allow_unhealthy,
                    "pad_id": pad_id, "writer_prefix": f"r{rank}-", "quiet": quiet, "batches": local_batches,
                }
                results += _run_worker(plan, tmp, f"{backend}-r{rank}")
        if group is not None:
            group.barrier()
        complete = _record_complete(m, samples, results) if rank == 0 else None
    finally:
        if group is not None:
            group.destroy_process_group()
    return {
        "store": m.store_path, "rank": rank, "world_size": world, "inputs": report.to_dict(),
        "variants": results, "complete": complete, "seconds": time.time() - t0,
    }


def _record_complete(m: Manifest, samples: list, results: list[dict[str, Any]]) -> dict[str, bool]:
    """Check every input sample is committed for every variant built; record the build as complete."""
    from hsstore.core.canonical import fingerprint
    from hsstore.storage.store import Store

    store = Store.open(m.store_path, mode="a")
    keys = sorted(s.key for s in samples)
    out = {}
    for vid in sorted({r["variant"] for r in results}):
        have = store.reader(vid, refresh=True).refs
        missing = [k for k in keys if k not in have]
        if missing:
            raise BuildFailed(f"variant {vid}: {len(missing)} of {len(keys)} samples are not committed after the "
                              f"build (first {missing[0]}); re-run the same command to complete it")
        record = {"complete": True, "n_samples": len(keys), "keys_fingerprint": fingerprint(keys),
                  "manifest": m.source, "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        store.blobs.put_atomic(f"{layout.builds_prefix(vid)}{fingerprint(keys)[:16]}.json", json.dumps(record).encode())
        out[vid] = True
    return out


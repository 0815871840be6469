"""Build benchmark: hsstore capture+copy+write vs the bare forward pass of the same batches (one run).

    python scripts/bench_build.py --shape 27b --device cuda --rows 32 --length 2048   # on a GPU
    python scripts/bench_build.py --shape tiny --device cpu                           # anywhere

Measured in one process on one model and the same batches, each after a warm-up:
  bare      the full decoder stack (all layers, no lm_head) — what any extractor pays at least;
  capture   hsstore's hooks, stopping after the deepest captured layer, no copy or write;
  build     hsstore's pipeline: capture, async device-to-host copy, background write to a store
            (per codec given), waiting for the last write to land.
Prints tokens/s, GB/s of states and the ratio build/bare as JSON (and a table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {
    "tiny": ({}, [0, 1, 2], [3]),
    # Qwen3.5/3.6-27B-shaped decoder (64 layers, hidden 5120; the builtin byte tokenizer keeps the
    # embedding small, so the model has ~24.5 B decoder parameters rather than 26.9 B in total)
    "27b": ({"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
             "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128}, [1, 16, 31, 46], [61]),
    # the 1.6 B hybrid of the seed experiment (hidden 2048, 24 layers): small enough to draw on a CPU
    "1.6b": ({"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128}, [1, 8, 15], [22]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--codecs", default="none,zstd,shuffle-zstd")
    ap.add_argument("--unit-tokens", type=int, default=32768)
    ap.add_argument("--store-dir", default=None, help="where the benchmark stores go (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np
    import torch

    from hsstore.core.batching import token_budget_batches
    from hsstore.build.capture import LayerCapture, decoder_layers, pad_batch
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.core.dtypes import TORCH
    from hsstore.core.keys import sample_key
    from hsstore.build.models import ModelSpec
    from hsstore.build.pipeline import capture_to_store
    from hsstore.storage.store import Store
    from hsstore.storage.writer import UnitWriter
    from hsstore.core.keys import SampleTokens

    overrides, aux, target = SHAPES[args.shape]
    init = "device" if args.device.startswith("cuda") else "cpu"
    spec = ModelSpec("builtin:tiny-qwen3_5", overrides, init_device=init)
    t0 = time.time()
    model = spec.load(TORCH[args.dtype], args.device, "sdpa")
    load_s = time.time() - t0
    cfg = model.config
    n_layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(args.rows):
        ids = rng.integers(0, 256, args.length).astype(np.int32)
        mask = np.ones(args.length, np.uint8)
        samples.append(SampleTokens(sample_key("bench", ids, mask), ids, mask))
    batches = token_budget_batches([s.length for s in samples], args.token_budget)
    tokens = sum(s.length for s in samples)
    layers = aux + target
    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def bare() -> None:
        stack = decoder_layers(model, n_layers)
        with torch.inference_mode():
            for b in batches:
                ids, mask = pad_batch([torch.from_numpy(samples[i].input_ids.astype("int64")) for i in b], 0, args.device)
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)
        _ = stack

    def capture_only() -> None:
        cap = LayerCapture(model, n_layers, layers)
        for b in batches:
            ids, mask = pad_batch([torch.from_numpy(samples[i].input_ids.astype("int64")) for i in b], 0, args.device)
            cap.run(ids, mask)
        cap.close()

    def timed(fn) -> float:
        sync()
        t = time.time()
        fn()
        sync()
        return time.time() - t

    timed(lambda: capture_only())  # warm-up (kernels, autotuning)
    from hsstore.build.backends import bound_kernels

    results = {"kernels": bound_kernels(model), "shape": args.shape, "device": args.device, "dtype": args.dtype, "tokens": tokens,
               "rows": args.rows, "length": args.length, "layers": layers, "hidden": hidden,
               "model_load_seconds": load_s, "device_name": torch.cuda.get_device_name() if cuda else "cpu"}
    itemsize = 2 if args.dtype != "fp32" else 4
    state_bytes = tokens * hidden * itemsize * len(layers)
    results["bare_seconds"] = timed(bare)
    results["capture_seconds"] = timed(capture_only)
    base = Path(args.store_dir or tempfile.mkdtemp(prefix="hsstore-bench-"))
    for codec in args.codecs.split(","):
        path = base / f"bench-{codec}.zarr"
        shutil.rmtree(path, ignore_errors=True)
        store = Store.create(path)
        vid = store.create_variant({"recipe": {"bench": codec}, "environment": {"dtype": args.dtype}},
                                   {"aux": aux, "target": target}, hidden, args.dtype, codec,
                                   chunk_tokens(hidden, itemsize))
        out = {}

        def run() -> None:
            out.update(capture_to_store(model, n_layers, layers, samples, batches, UnitWriter(store, vid), args.device,
                                        0, args.unit_tokens))

        secs = timed(run)
        results[f"build_{codec}_seconds"] = secs
        results[f"build_{codec}_writer_busy_seconds"] = out["writer_busy_seconds"]
        results[f"build_{codec}_bytes"] = out["bytes"]
        shutil.rmtree(path, ignore_errors=True)
    results["state_bytes"] = state_bytes
    print(f"{args.shape} on {results['device_name']}: {tokens:,} tokens, {state_bytes / 1e9:.2f} GB of states")
    print(f"{'pass':<18}{'seconds':>9}{'tokens/s':>12}{'GB/s states':>13}{'vs bare':>9}")
    for key in ["bare", "capture"] + [f"build_{c}" for c in args.codecs.split(",")]:
        s = results[f"{key}_seconds"]
        print(f"{key:<18}{s:9.2f}{tokens / s:12,.0f}{state_bytes / s / 1e9:13.2f}{s / results['bare_seconds']:9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

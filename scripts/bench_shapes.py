"""Kernel compilation on a fresh host: batch shapes with and without bucketed padded lengths, one run.

    python scripts/bench_shapes.py --rows 96 --json shapes.json        # on a GPU with fla installed

For each padding mode (the longest sample of each batch, as before; bucketed: batching.padded_length)
a fresh process with an empty triton cache (TRITON_CACHE_DIR) loads the seed experiment's 1.6 B hybrid
on the GPU, plans token-budget batches of ``--rows`` rows of random lengths (256..2048 tokens), and runs
the capture over every batch twice: the first pass compiles and autotunes kernels for every new batch
shape, the second is warm. Reports distinct shapes, files triton wrote and first - second pass seconds
(what a fresh host pays), and the padded tokens each mode runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(bucketed: bool, rows: int, budget: int) -> dict:
    import numpy as np
    import torch

    from hsstore.capture.model.kernels import bound_kernels
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.capture.run.hooks import LayerCapture, pad_batch
    from hsstore.core.batching import batch_shapes, padded_length, token_budget_batches
    from hsstore.testing.factories import SHAPES

    overrides, aux, target = SHAPES["1.6b"]
    model = ModelSpec("builtin:tiny-qwen3_5", overrides, init_device="device").load(torch.bfloat16, "cuda", "sdpa")
    lengths = np.random.default_rng(0).integers(256, 2049, rows).tolist()
    batches = token_budget_batches(lengths, budget, bucketed)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 250, (n,), generator=g) for n in lengths]
    cap = LayerCapture(model, overrides["num_hidden_layers"], aux + target)

    def run() -> float:
        torch.cuda.synchronize()
        t0 = time.time()
        for b in batches:
            width = max(lengths[i] for i in b)
            cap.run(*pad_batch([seqs[i] for i in b], 0, "cuda", padded_length(width) if bucketed else width))
        torch.cuda.synchronize()
        return time.time() - t0

    first, second = run(), run()
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    shapes = batch_shapes(lengths, batches, bucketed)
    return {
        "bucketed": bucketed,
        "kernels": bound_kernels(model),
        "batches": len(batches),
        "shapes": len(shapes),
        "tokens": sum(lengths),
        "padded_tokens": sum(
            len(s) * w
            for s, w in zip(
                batches, [(padded_length if bucketed else int)(max(lengths[i] for i in b)) for b in batches]
            )
        ),
        "first_pass_seconds": first,
        "second_pass_seconds": second,
        "compile_seconds": first - second,
        "triton_cache_files": sum(1 for p in cache.rglob("*") if p.is_file()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=("plain", "bucketed"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "bucketed", args.rows, args.token_budget)))
        return
    results = {}
    for mode in ("plain", "bucketed"):
        with tempfile.TemporaryDirectory(prefix=f"triton-{mode}-") as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
            r = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--rows",
                    str(args.rows),
                    "--token-budget",
                    str(args.token_budget),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            if r.returncode != 0:
                raise SystemExit(f"{mode}: {r.stderr[-3000:]}")
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"{'padding':<10}{'batches':>8}{'shapes':>8}{'padded tok':>12}{'triton files':>14}{'1st pass s':>12}"
        f"{'2nd pass s':>12}{'compile s':>11}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<10}{r['batches']:8d}{r['shapes']:8d}{r['padded_tokens']:12,d}{r['triton_cache_files']:14d}"
            f"{r['first_pass_seconds']:12.1f}{r['second_pass_seconds']:12.1f}{r['compile_seconds']:11.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

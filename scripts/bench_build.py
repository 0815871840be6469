"""Build benchmark: hsstore capture+copy+write vs the bare forward pass of the same batches (one run).

    python scripts/bench_build.py --shape 27b --device cuda --rows 32 --length 2048   # on a GPU
    python scripts/bench_build.py --shape tiny --device cpu                           # anywhere

    python scripts/bench_build.py --shape 27b --device cuda --rows 76 --length 2048 \
        --codecs shuffle-zstd,fp8:shuffle-zstd --repeat 2                      # FP8 and bf16, passes alternating

Measured in one process on one model and the same batches (padded as a build pads them), after a warm-up:
  bare      the full decoder stack (all layers, no lm_head) — what any extractor pays at least;
  capture   hsstore's hooks, stopping after the deepest captured layer, no copy or write;
  build     hsstore's pipeline: capture, async device-to-host copy, background write to a store
            (per codec given; ``fp8:CODEC`` quantizes to FP8 e4m3 on the device before the copy),
            waiting for the last write to land.
``--repeat N`` runs the sequence bare, each build, N times (alternating order; the table shows the
fastest of each and the JSON every run). Prints tokens/s, GB/s of states, bytes against raw states in
the computed dtype and the ratio build/bare as JSON (and a table); FP8 builds also report the storage
error per layer that the build measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from hsstore.testing.factories import SHAPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--codecs", default="none,zstd,shuffle-zstd", help="CODEC or fp8:CODEC, comma-separated")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--unit-tokens", type=int, default=32768)
    ap.add_argument("--store-dir", default=None, help="where the benchmark stores go (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np
    import torch

    from hsstore.capture.model.kernels import bound_kernels
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.capture.run.hooks import LayerCapture, pad_batch
    from hsstore.core.batching import padded_length, token_budget_batches
    from hsstore.core.dtypes import TORCH
    from hsstore.core.keys import SampleTokens, sample_key

    overrides, aux, target = SHAPES[args.shape]
    init = "device" if args.device.startswith("cuda") else "cpu"
    t0 = time.time()
    model = ModelSpec("builtin:tiny-qwen3_5", overrides, init_device=init).load(TORCH[args.dtype], args.device, "sdpa")
    load_s = time.time() - t0
    n_layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
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

    def padded(b: list[int]) -> tuple:
        seqs = [torch.from_numpy(samples[i].input_ids.astype("int64")) for i in b]
        return pad_batch(seqs, 0, args.device, padded_length(max(len(x) for x in seqs)))

    def bare() -> None:
        with torch.inference_mode():
            for b in batches:
                ids, mask = padded(b)
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    def capture_only() -> None:
        cap = LayerCapture(model, n_layers, layers)
        for b in batches:
            cap.run(*padded(b))
        cap.close()

    def timed(fn) -> float:
        sync()
        t = time.time()
        fn()
        sync()
        return time.time() - t

    timed(capture_only)  # warm-up (kernels, autotuning)
    itemsize = 2 if args.dtype != "fp32" else 4
    results = {
        "kernels": bound_kernels(model),
        "shape": args.shape,
        "device": args.device,
        "dtype": args.dtype,
        "tokens": tokens,
        "rows": args.rows,
        "length": args.length,
        "layers": layers,
        "hidden": hidden,
        "model_load_seconds": load_s,
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "state_bytes": tokens * hidden * itemsize * len(layers),
        "runs": [],
    }
    base = Path(args.store_dir or tempfile.mkdtemp(prefix="hsstore-bench-"))
    results["capture_seconds"] = timed(capture_only)
    for rep in range(args.repeat):
        results["runs"].append({"pass": "bare", "rep": rep, "seconds": timed(bare)})
        for name in args.codecs.split(","):
            run = build_pass(model, n_layers, aux, target, samples, batches, name, args, base, timed)
            results["runs"].append({"pass": f"build_{name}", "rep": rep, **run})
    report(results, args)


def build_pass(
    model,
    n_layers: int,
    aux: list,
    target: list,
    samples: list,
    batches: list,
    name: str,
    args: argparse.Namespace,
    base: Path,
    timed,
) -> dict:
    """One build into a fresh store with codec (and precision) ``name``; its time, bytes and FP8 error."""
    from hsstore.capture.run.pipeline import capture_to_store
    from hsstore.core.precision_names import codec_for_codes
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.storage.store import Store
    from hsstore.storage.writer import UnitWriter
    from hsstore.testing.factories import provenance

    precision, _, codec = name.rpartition(":")
    precision = {"": None, "fp8": "fp8-e4m3"}[precision]
    codec = codec_for_codes(codec) if precision else codec  # as a build stores FP8 codes
    hidden = model.config.hidden_size
    path = base / f"bench-{name.replace(':', '-')}.zarr"
    shutil.rmtree(path, ignore_errors=True)
    store = Store.create(path)
    layers = {"aux": aux, "target": target}
    prov = provenance(args.dtype, layers=layers, model=f"bench-{codec}", precision=precision)
    itemsize = 1 if precision else (2 if args.dtype != "fp32" else 4)
    vid = store.create_variant(
        prov, layers, hidden, args.dtype, codec, chunk_tokens(hidden, itemsize), precision=precision
    )
    out: dict = {}
    secs = timed(
        lambda: out.update(
            capture_to_store(
                model,
                n_layers,
                aux + target,
                samples,
                batches,
                UnitWriter(store, vid),
                args.device,
                0,
                args.unit_tokens,
                precision=precision,
            ).to_dict()
        )
    )
    run = {
        "seconds": secs,
        "writer_busy_seconds": out["writer_busy_seconds"],
        "bytes": out["bytes"],
        "tail_seconds": out["tail_seconds"],
        "first_batch_seconds": out["first_batch_seconds"],
    }
    if precision:
        from hsstore.core.quant import summary

        run["fp8_error"] = {
            str(i): summary(e).to_dict() for i, e in store.reader(vid, refresh=True).quant_error().items()
        }
    shutil.rmtree(path, ignore_errors=True)
    return run


def report(results: dict, args: argparse.Namespace) -> None:
    tokens, state_bytes = results["tokens"], results["state_bytes"]
    best: dict[str, dict] = {}
    for r in results["runs"]:
        if r["pass"] not in best or r["seconds"] < best[r["pass"]]["seconds"]:
            best[r["pass"]] = r
    bare = best["bare"]["seconds"]
    results["best"] = {
        k: {
            **v,
            "x_bare": v["seconds"] / bare,
            "smaller_than_raw": (state_bytes / v["bytes"]) if v.get("bytes") else None,
        }
        for k, v in best.items()
    }
    print(
        f"{args.shape} on {results['device_name']}: {tokens:,} tokens, {state_bytes / 1e9:.2f} GB of states "
        f"({args.dtype}); fastest of {args.repeat} alternating run(s)"
    )
    print(f"{'pass':<26}{'seconds':>9}{'tokens/s':>12}{'GB/s states':>13}{'vs bare':>9}{'x smaller':>11}")
    print(
        f"{'capture':<26}{results['capture_seconds']:9.2f}{tokens / results['capture_seconds']:12,.0f}"
        f"{state_bytes / results['capture_seconds'] / 1e9:13.2f}{results['capture_seconds'] / bare:9.3f}"
    )
    for key, r in results["best"].items():
        small = f"{r['smaller_than_raw']:11.2f}" if r["smaller_than_raw"] else ""
        print(
            f"{key:<26}{r['seconds']:9.2f}{tokens / r['seconds']:12,.0f}{state_bytes / r['seconds'] / 1e9:13.2f}"
            f"{r['x_bare']:9.3f}{small}"
        )
        for layer, e in sorted(r.get("fp8_error", {}).items(), key=lambda x: int(x[0])):
            print(
                f"    fp8 layer {layer}: rel-L2 {e['rel_l2']:.3e}, cos mean {e['cos_mean']:.6f}, min {e['cos_min']:.6f}"
            )
    if args.repeat > 1:  # each round against its own bare pass, and the median over rounds
        rounds: dict[str, list[float]] = {}
        for rep in range(args.repeat):
            runs = {r["pass"]: r["seconds"] for r in results["runs"] if r["rep"] == rep}
            ratios = {k: v / runs["bare"] for k, v in runs.items() if k != "bare"}
            for k, v in ratios.items():
                rounds.setdefault(k, []).append(v)
            print(f"round {rep + 1}: " + ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items()))
        results["median_x_bare"] = {k: statistics.median(v) for k, v in rounds.items()}
        print("median over rounds: " + ", ".join(f"{k} {v:.3f}x" for k, v in results["median_x_bare"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

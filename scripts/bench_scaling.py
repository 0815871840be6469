"""Build scaling: the same manifest built as R ranks x G GPUs per rank, for several (R, G), in one run.

    python scripts/bench_scaling.py --configs 1x1,2x1 --shape 27b --rows 384 --out out/scaling        # data parallel
    python scripts/bench_scaling.py --configs 1x1,1x2 --shape 1.6b --init cpu --out out/split        # one model on 2 GPUs
    python scripts/bench_scaling.py --configs 1x1,2x1 --shape tiny --device cpu --backend torch --rows 64   # anywhere

Writes a synthetic jsonl (seeded, lengths spread between --min-len and --max-len), a manifest for the
builtin hybrid at the chosen shape, then for each config runs the real command
(``python -m hsstore build`` for 1 rank, ``torchrun --nproc-per-node R -m hsstore build`` otherwise,
``--gpus-per-rank G``) into its own store. A short warm-up build first fills the triton cache so no
measured run pays JIT.

Per run: tokens, the build loop's wall time (slowest rank: model loaded, first batch to last unit
committed), aggregate tokens/s and the speed-up over the baseline config (the first, or --baseline;
its fastest run); the steady-state rate (sum over ranks of tokens after the first batch / time from the
end of the first batch to the last forward: what a long build runs at); end-to-end wall time of the
command too; files the run added to the triton cache (JIT or autotuning the warm-up did not cover). Then checks each store holds every sample once and is bit-identical to the first
(``hsstore diff``), and prints a table + JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hsstore.testing.factories import SHAPES, config_toml, layers_toml

REPO = Path(__file__).resolve().parents[1]


def write_inputs(out: Path, rows: int, min_len: int, max_len: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["state", "layer", "draft", "token", "cache", "model", "verify", "store", "chunk", "shard"]
    path = out / "scaling.jsonl"
    with path.open("w") as f:
        for r in range(rows):
            n = int(rng.integers(min_len, max_len + 1))
            text = f"row {r}: " + " ".join(rng.choice(words, size=n // 5))
            f.write(json.dumps({"text": text[:n]}) + "\n")
    return path


def write_manifest(
    out: Path,
    data: Path,
    store: Path,
    shape: str,
    backend: str,
    device: str,
    codec: str,
    max_len: int,
    token_budget: int,
    init: str,
) -> Path:
    text = f"""[model]
path = "builtin:tiny-qwen3_5"
{config_toml(shape)}
init_device = "{init}"
layers = {layers_toml(shape)}

[data]
files = ["{data}"]
format = "text"
max_length = {max_len}

[build]
backends = ["{backend}"]
dtypes = ["bf16"]
devices = ["{device}"]
token_budget = {token_budget}

[store]
path = "{store}"
codec = "{codec}"
"""
    path = out / f"scaling-{store.stem}.toml"
    path.write_text(text)
    return path


def triton_cache_files() -> int:
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return sum(len(files) for _, _, files in os.walk(root)) if root.is_dir() else 0


def run_build(manifest: Path, ranks: int, logs: Path, extra: list[str]) -> tuple[float, list[dict]]:
    """Run the build; returns (wall seconds, one summary per rank)."""
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    if ranks == 1:
        cmd = [sys.executable, "-m", "hsstore", "build", str(manifest), "--quiet", "--json", *extra]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            "--log-dir",
            str(logs),
            "--redirects",
            "1",
            "-m",
            "hsstore",
            "build",
            str(manifest),
            "--quiet",
            "--json",
            *extra,
        ]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"build with {ranks} rank(s) failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    if ranks == 1:
        return wall, [json.loads(r.stdout)]
    outs = sorted(glob.glob(str(logs / "**" / "stdout.log"), recursive=True))
    summaries = [json.loads(Path(p).read_text()) for p in outs]
    if len(summaries) != ranks:
        sys.exit(f"expected {ranks} rank summaries under {logs}, found {len(summaries)}")
    return wall, sorted(summaries, key=lambda s: s["rank"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1x1,2x1", help="RANKSxGPUS_PER_RANK, comma-separated; a config may repeat")
    ap.add_argument("--baseline", default=None, help="the config speed-ups are relative to (default: the first)")
    ap.add_argument("--warmup-rows", type=int, default=64, help="rows of the warm-up build (fills the triton caches)")
    ap.add_argument(
        "--init",
        choices=("device", "cpu"),
        default=None,
        help="where random weights are drawn (default: device on cuda; cpu is needed for G > 1)",
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="fla")
    ap.add_argument("--codec", default="zstd", help="zstd: what the runs in docs/benchmarks.md used")
    ap.add_argument("--rows", type=int, default=384)
    ap.add_argument("--min-len", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--out", default="out/scaling")
    ap.add_argument("--store-dir", default=None, help="where the stores go (default: --out)")
    ap.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    ap.add_argument(
        "--no-diff",
        action="store_true",
        help="skip the bit-exactness diffs (they read every store); each store is deleted after its run",
    )
    args = ap.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stores = Path(args.store_dir).resolve() if args.store_dir else out
    stores.mkdir(parents=True, exist_ok=True)
    data = write_inputs(out, args.rows, args.min_len, args.max_len)
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    init = args.init or ("device" if args.device == "cuda" else "cpu")

    def manifest(name: str) -> Path:
        store = stores / f"{name}.zarr"
        shutil.rmtree(store, ignore_errors=True)
        return write_manifest(
            out, data, store, args.shape, args.backend, args.device, args.codec, args.max_len, args.token_budget, init
        )

    warm = manifest("warmup")
    run_build(warm, 1, out / "logs-warmup", ["--limit", str(args.warmup_rows)])  # JIT + autotuning land on disk
    shutil.rmtree(stores / "warmup.zarr", ignore_errors=True)

    runs = []
    for k, (n, g) in enumerate(configs):
        name = f"{n}x{g}" + (f"-{k}" if configs.index((n, g)) != k else "")  # a repeat gets its own store
        cache0 = triton_cache_files()
        wall, summaries = run_build(manifest(name), n, out / f"logs-{name}", ["--gpus-per-rank", str(g)])
        cache_added = triton_cache_files() - cache0
        if args.no_diff and not args.keep:  # nothing reads it again: free the disk for the next run
            shutil.rmtree(stores / f"{name}.zarr", ignore_errors=True)
        variants = [v for s in summaries for v in s["variants"]]
        tokens = sum(v["tokens"] for v in variants)
        loop = max(v["loop_seconds"] for v in variants)
        runs.append(
            {
                "config": name,
                "ranks": n,
                "gpus_per_rank": g,
                "tokens": tokens,
                "samples": sum(v["samples_written"] for v in variants),
                "loop_seconds": loop,
                "tokens_per_second": tokens / loop,
                "wall_seconds": wall,
                "steady_tokens_per_second": sum(
                    v["steady_tokens"] / v["steady_seconds"] for v in variants if v.get("steady_seconds")
                ),
                "triton_cache_files_added": cache_added,
                "wall_tokens_per_second": tokens / wall,
                "per_rank": [
                    {
                        "rank": s["rank"],
                        "device": v["device"],
                        "tokens": v["tokens"],
                        "loop_seconds": v["loop_seconds"],
                        "worker_seconds": v["seconds"],
                        "writer_busy_seconds": v["writer_busy_seconds"],
                        "first_batch_seconds": v.get("first_batch_seconds"),
                        "tail_seconds": v.get("tail_seconds"),
                        "pinned_alloc_seconds": v.get("pinned_alloc_seconds"),
                        "pinned_reserve_seconds": v.get("pinned_reserve_seconds"),
                        "pinned_reserve_wait_seconds": v.get("pinned_reserve_wait_seconds"),
                        "pinned_reserve_error": v.get("pinned_reserve_error"),
                        "steady_tokens": v.get("steady_tokens"),
                        "steady_seconds": v.get("steady_seconds"),
                        "peak_gpu_memory_gb": v.get("peak_gpu_memory_gb"),
                    }
                    for s in summaries
                    for v in s["variants"]
                ],
                "complete": summaries[0]["complete"],
                "variant": variants[0]["variant"],
            }
        )
        # partial results survive a run cut short (a device command has a time limit)
        (out / "scaling.partial.json").write_text(json.dumps(runs, indent=2))
        for p in runs[-1]["per_rank"]:
            p = {k: (0.0 if v is None else v) for k, v in p.items()}  # a rank with nothing to do times nothing
            print(
                f"{name} rank {p['rank']}: {p['tokens']:,} tokens, loop {p['loop_seconds']:.1f} s (first batch "
                f"{p['first_batch_seconds']:.1f}, tail {p['tail_seconds']:.1f}, pinned alloc "
                f"{p['pinned_alloc_seconds']:.1f}; reserved while loading {p['pinned_reserve_seconds']:.1f}, "
                f"waited {p['pinned_reserve_wait_seconds']:.1f}), steady {p['steady_tokens']:,} tokens in "
                f"{p['steady_seconds']:.1f} s, writers busy {p['writer_busy_seconds']:.1f} s",
                flush=True,
            )
    # the baseline is the fastest run of its config (repeat it last to see run-order effects)
    base_cfg = tuple(int(v) for v in args.baseline.split("x")) if args.baseline else configs[0]
    base_runs = [r for r in runs if (r["ranks"], r["gpus_per_rank"]) == base_cfg]
    if not base_runs:
        sys.exit(f"--baseline {args.baseline} is not one of --configs {args.configs}")
    base = max(base_runs, key=lambda r: r["tokens_per_second"])
    base_steady = max(r["steady_tokens_per_second"] for r in base_runs)
    for r in runs:
        r["speedup"] = r["tokens_per_second"] / base["tokens_per_second"]
        r["wall_speedup"] = r["wall_tokens_per_second"] / base["wall_tokens_per_second"]
        r["steady_speedup"] = r["steady_tokens_per_second"] / base_steady if base_steady else None
    checks = []
    for r in [] if args.no_diff else [r for r in runs if r is not base]:
        a, b = stores / f"{base['config']}.zarr", stores / f"{r['config']}.zarr"
        dev = ["--device", "cuda"] if args.device == "cuda" else []
        js = out / f"diff-{base['config']}-{r['config']}.json"
        d = subprocess.run(
            [sys.executable, "-m", "hsstore", "diff", str(a), str(b), "--json", str(js), *dev],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        diff = json.loads(js.read_text()) if d.returncode in (0, 1) and js.exists() else {"error": d.stderr[-2000:]}
        checks.append({"config": r["config"], "same_variant": r["variant"] == base["variant"], "diff": diff})
    result = {
        "shape": args.shape,
        "backend": args.backend,
        "codec": args.codec,
        "device": args.device,
        "init": init,
        "rows": args.rows,
        "runs": runs,
        "checks": checks,
    }
    if args.device == "cuda":
        import torch

        result["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    (out / "scaling.json").write_text(json.dumps(result, indent=2))
    print(
        f"{'RxG':>5}{'tokens':>11}{'loop s':>9}{'tok/s':>10}{'speed-up':>10}{'steady tok/s':>14}{'speed-up':>10}"
        f"{'wall s':>9}{'wall speed-up':>15}{'new JIT files':>15}"
    )
    for r in runs:
        steady = f"{r['steady_speedup']:>9.2f}x" if r["steady_speedup"] else f"{'-':>10}"
        print(
            f"{r['config']:>5}{r['tokens']:>11,}{r['loop_seconds']:>9.1f}{r['tokens_per_second']:>10,.0f}"
            f"{r['speedup']:>9.2f}x{r['steady_tokens_per_second']:>14,.0f}{steady}"
            f"{r['wall_seconds']:>9.1f}{r['wall_speedup']:>14.2f}x{r['triton_cache_files_added']:>15}"
        )
    for c in checks:
        print(
            f"{c['config']} vs {base['config']}: same variant {c['same_variant']}; diff: "
            + json.dumps(
                {k: c["diff"].get(k) for k in ("verdict", "shared_samples", "only_a", "only_b")}
                if "error" not in c["diff"]
                else c["diff"]
            )
        )
    if not args.keep:
        for r in runs:
            shutil.rmtree(stores / f"{r['config']}.zarr", ignore_errors=True)


if __name__ == "__main__":
    main()

"""Diff benchmark: ``hsstore diff`` time against reading the same two variants, in one run.

    python scripts/bench_diff.py --dir /tmp/hsdiff --samples 96 --hidden 1024 --reps 2
    python scripts/bench_diff.py --store s.zarr --a dtype=bf16 --b dtype=fp32 --device cuda

Without ``--store`` it writes a store of two variants of synthetic residual-stream-like states (fp32
reference B, bf16 A = B plus small noise, rounded), ``--layers`` layers, the default codec. Then, warm
(a first untimed pass fills the page cache), alternating per rep: read = every sample of both variants
through ``HiddenStateDataset`` (all layers, 0 workers: what a training loop reads), diff = the library
call ``hsstore diff`` makes. Prints seconds (median), GB/s of logical state bytes and the ratio
read time / diff time (>= 0.8 is the target: diff streams at 80% of the read rate or better).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hsstore import HiddenStateDataset, Store
from hsstore.compare.diff import run_diff
from hsstore.core.keys import SampleTokens, sample_key
from hsstore.storage.codecs import DEFAULT, chunk_tokens
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import provenance


def _provenance(dtype: str, layers: list[int]) -> dict:
    return provenance(dtype, tok="bench", layers={"aux": layers[:-1], "target": layers[-1:]}, model="bench")


def make_store(path: Path, n: int, hidden: int, n_layers: int, mean_len: int, codec: str, seed: int = 0) -> str:
    """Two variants (bf16 A, fp32 B) of ``n`` samples; returns the store path."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    store = Store.create(path)
    layers = list(range(n_layers))
    vids = {}
    for dt, size in (("bf16", 2), ("fp32", 4)):
        vids[dt] = store.create_variant(_provenance(dt, layers), {"aux": layers[:-1], "target": layers[-1:]},
                                        hidden, dt, codec, chunk_tokens(hidden, size))
    scale = torch.exp(torch.randn(hidden, generator=g))  # per-channel scales, like a residual stream
    writers = {dt: UnitWriter(store, vid) for dt, vid in vids.items()}
    for start in range(0, n, 8):
        samples = []
        for _ in range(min(8, n - start)):
            t = int(rng.integers(mean_len // 2, mean_len * 3 // 2))
            ids = rng.integers(0, 150000, t).astype(np.int32)
            mask = np.ones(t, np.uint8)
            samples.append(SampleTokens(sample_key("bench", ids, mask), ids, mask))
        total = sum(s.length for s in samples)
        ref = {i: torch.randn(total, hidden, generator=g) * scale * (1 + i) for i in layers}
        noisy = {i: (x + 2e-3 * (1 + i) * torch.randn(total, hidden, generator=g) * scale).bfloat16()
                 for i, x in ref.items()}
        writers["fp32"].write(samples, ref)
        writers["bf16"].write(samples, noisy)
    return str(path)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def read_both(store: str, a: str, b: str) -> int:
    """Read every sample of both variants through the dataset class; returns logical state bytes."""
    total = 0
    for sel in (a, b):
        ds = HiddenStateDataset(store, variant=sel)
        for i in range(len(ds)):
            item = ds[i]
            total += item["aux_hidden"].nbytes + item["target_hidden"].nbytes
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-bench-diff")
    ap.add_argument("--store", help="an existing store (skip writing synthetic states)")
    ap.add_argument("--a", default="dtype=bf16")
    ap.add_argument("--b", default="dtype=fp32")
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mean-len", type=int, default=2500)
    ap.add_argument("--codec", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="diff worker threads (default: every core)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    store = args.store
    if store is None:
        path = Path(args.dir) / f"s{args.samples}-h{args.hidden}-l{args.layers}-{args.codec}.zarr"
        if not path.exists():
            t0 = time.perf_counter()
            make_store(path, args.samples, args.hidden, args.layers, args.mean_len, args.codec)
            print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        store = str(path)
    a, b = f"{store}#{args.a}", f"{store}#{args.b}"
    nbytes = read_both(store, args.a, args.b)  # warm-up: page cache
    run_diff(a, b, device=args.device)
    reads, diffs, read_cpu, diff_cpu = [], [], [], []
    for _ in range(args.reps):
        c0, t0 = _cpu(), time.perf_counter()
        read_both(store, args.a, args.b)
        reads.append(time.perf_counter() - t0)
        read_cpu.append(_cpu() - c0)
        c0, t0 = _cpu(), time.perf_counter()
        report = run_diff(a, b, device=args.device, threads=args.threads)
        diffs.append(time.perf_counter() - t0)
        diff_cpu.append(_cpu() - c0)
    r, d = statistics.median(reads), statistics.median(diffs)
    out = {"store": store, "a": args.a, "b": args.b, "device": args.device, "cpus": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "state_bytes": nbytes, "tokens": report.tokens,
           "read_seconds": reads, "diff_seconds": diffs, "read_cpu_seconds": read_cpu, "diff_cpu_seconds": diff_cpu, "read_gb_s": nbytes / r / 1e9, "diff_gb_s": nbytes / d / 1e9,
           "ratio": r / d}
    print(f"{nbytes / 1e9:.2f} GB of states, {report['tokens']:,} tokens, {os.cpu_count()} CPUs, device {args.device}")
    print(f"read both variants {r:.2f} s ({out['read_gb_s']:.2f} GB/s)   diff {d:.2f} s ({out['diff_gb_s']:.2f} GB/s)")
    print(f"diff/read rate ratio {out['ratio']:.2f}  (reads {', '.join(f'{x:.2f}' for x in reads)}; "
          f"diffs {', '.join(f'{x:.2f}' for x in diffs)})")
    print(f"CPU seconds (user+sys, median): read {statistics.median(read_cpu):.2f}, diff {statistics.median(diff_cpu):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

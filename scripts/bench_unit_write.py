"""Time to write one unit (the tail a build pays after its last forward), serial vs parallel arrays.

    python scripts/bench_unit_write.py --tokens 8192 --hidden 5120 --reps 5

A unit of 5 bf16 layers (1, 16, 31, 46, 61) is written through UnitWriter with its health statistics
given (as the GPU pipeline does), once with ``io_threads = 1`` (arrays one after the other) and once
with the default (one thread per array, up to 8), alternating, into fresh stores on the same disk.
Prints the median seconds and the ratio per codec.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--codecs", default="zstd,none")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = ap.parse_args()

    import numpy as np
    import torch

    from hsstore.core.keys import SampleTokens, sample_key
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.storage.stats import stats_tensor
    from hsstore.storage.store import Store
    from hsstore.storage.writer import UnitWriter
    from hsstore.testing.factories import AUX, TARGET, provenance

    layers = {"aux": AUX, "target": TARGET}
    rng = np.random.default_rng(0)
    lengths = [args.tokens // 8] * 8
    default_threads = None  # the writer's own default, read from the first writer
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(args.reps):
        samples = []
        for n in lengths:
            ids = rng.integers(0, 250, n).astype(np.int32)
            samples.append(SampleTokens(sample_key(f"r{rep}", ids, np.ones(n, np.uint8)), ids, np.ones(n, np.uint8)))
        g = torch.Generator().manual_seed(rep)
        states = {
            i: torch.randn(sum(lengths), args.hidden, generator=g).to(torch.bfloat16)
            for i in layers["aux"] + layers["target"]
        }
        health = {i: stats_tensor(t, lengths) for i, t in states.items()}
        for codec in args.codecs.split(","):
            for serial in (True, False) if rep % 2 == 0 else (False, True):
                d = tempfile.mkdtemp(prefix="hsstore-unit-", dir=args.dir)
                store = Store.create(Path(d) / "s.zarr")
                prov = provenance("bf16", tok="bench", layers=layers, model=f"bench-{rep}")
                # the chunk a build uses for this hidden size
                vid = store.create_variant(prov, layers, args.hidden, "bf16", codec, chunk_tokens(args.hidden, 2))
                w = UnitWriter(store, vid)
                default_threads = default_threads or w.io_threads
                threads = w.io_threads = 1 if serial else default_threads
                t0 = time.perf_counter()
                w.write(samples, states, health=health)
                times.setdefault((codec, threads), []).append(time.perf_counter() - t0)
                shutil.rmtree(d)
    mb = sum(lengths) * args.hidden * 2 * 5 / 1e6
    print(
        f"one unit: {sum(lengths):,} tokens x 5 layers x {args.hidden} bf16 = {mb:.0f} MB; {os.cpu_count()} cores; "
        f"medians of {args.reps}"
    )
    for codec in args.codecs.split(","):
        a, b = statistics.median(times[(codec, 1)]), statistics.median(times[(codec, default_threads)])
        print(f"{codec:>6}: serial {a:.2f}s, {default_threads} threads {b:.2f}s -> {a / b:.2f}x faster")


if __name__ == "__main__":
    main()

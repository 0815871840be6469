"""Codec speed and size on bf16 hidden states: one chunk at a time, one thread, as hsstore codes them.

    python scripts/bench_codecs.py --hidden 4096 --tokens 4096 --reps 5

States shaped like a residual stream (gaussian x per-channel scales exp(N(0,1)), bf16), cut into
hsstore's ~1 MiB chunks. For each codec hsstore offers (the exact numcodecs objects the store writes
and reads with) and two ablations of the default (blosc's automatic block size; bit- instead of byte
shuffle), prints raw/compressed size and single-thread encode/decode MB/s of logical bytes (best of
--reps), with decode speed relative to plain zstd-1 from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numcodecs.blosc
    import numpy as np
    import torch
    from numcodecs import Blosc

    from hsstore.codecs import CHOICES, chunk_tokens
    from hsstore.shardio import compressor

    numcodecs.blosc.set_nthreads(1)  # the store codes chunks on its own threads, one chunk per call
    g = torch.Generator().manual_seed(0)
    scale = torch.exp(torch.randn(args.hidden, generator=g))
    states = (torch.randn(args.tokens, args.hidden, generator=g) * scale).to(torch.bfloat16)
    data = states.view(torch.int16).numpy().view(np.uint16)
    rows = chunk_tokens(args.hidden, 2)
    chunks = [np.ascontiguousarray(data[i : i + rows]) for i in range(0, args.tokens - rows + 1, rows)]
    raw = sum(c.nbytes for c in chunks)

    codecs = {name: compressor(name, 2) for name in CHOICES if name != "none"}
    codecs["shuffle-zstd, blosc auto block size"] = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, typesize=2)
    codecs["shuffle-zstd with bitshuffle"] = Blosc(cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE, typesize=2,
                                                   blocksize=1 << 20)
    results = {}
    for name, codec in codecs.items():
        encoded = [bytes(codec.encode(c)) for c in chunks]
        for e, c in zip(encoded, chunks):  # lossless, or it is not a candidate
            assert np.array_equal(np.frombuffer(codec.decode(e), dtype=np.uint16).reshape(c.shape), c), name
        enc = dec = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for c in chunks:
                codec.encode(c)
            enc = min(enc, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for e in encoded:
                codec.decode(e)
            dec = min(dec, time.perf_counter() - t0)
        results[name] = {"raw_over_size": raw / sum(map(len, encoded)), "encode_mb_s": raw / enc / 1e6,
                         "decode_mb_s": raw / dec / 1e6}
    base = results["zstd"]["decode_mb_s"]
    print(f"{len(chunks)} chunks of {rows} tokens x {args.hidden} bf16 ({raw / 1e6:.0f} MB); one thread; best of {args.reps}")
    print(f"{'codec':40s}{'raw/size':>9}{'encode MB/s':>13}{'decode MB/s':>13}{'decode vs zstd':>16}")
    for name, r in results.items():
        print(f"{name:40s}{r['raw_over_size']:>9.3f}{r['encode_mb_s']:>13,.0f}{r['decode_mb_s']:>13,.0f}"
              f"{r['decode_mb_s'] / base:>15.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()

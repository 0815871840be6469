"""Codec speed and size on bf16 hidden states: one chunk at a time, one thread, as hsstore codes them.

    python scripts/bench_codecs.py --hidden 4096 --tokens 4096 --reps 5          # synthetic states
    python scripts/bench_codecs.py --source model --tokens 1024 --reps 5         # a random-init model's

``--source synthetic``: states shaped like a residual stream (gaussian x per-channel scales
exp(N(0,1)), bf16). ``--source model``: layers 1 and 3 of a random-init hybrid with the 27B shape's
widths (hidden 5120) cut to 4 layers so it runs on a CPU (~3 GB in bf16), on random token ids. Cut into
hsstore's ~1 MiB chunks. For each codec hsstore offers (the exact numcodecs objects the store writes
and reads with) and two ablations of the default (blosc's automatic block size; bit- instead of byte
shuffle), prints raw/compressed size and single-thread encode/decode MB/s of logical bytes (best of
--reps), with decode speed relative to plain zstd-1 from the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=("synthetic", "model"), default="synthetic")
    ap.add_argument("--hidden", type=int, default=4096, help="synthetic states only")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numcodecs.blosc
    import torch
    from numcodecs import Blosc

    from hsstore.storage.codecs import CHOICES, REGISTRY

    numcodecs.blosc.set_nthreads(1)  # the store codes chunks on its own threads, one chunk per call
    if args.source == "synthetic":
        g = torch.Generator().manual_seed(0)
        scale = torch.exp(torch.randn(args.hidden, generator=g))
        sets = {"synthetic": (torch.randn(args.tokens, args.hidden, generator=g) * scale).to(torch.bfloat16)}
    else:
        sets = model_states(args.tokens)
    codecs = {name: REGISTRY[name].numcodec(2) for name in CHOICES if name != "none"}
    codecs["shuffle-zstd, blosc auto block size"] = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, typesize=2)
    codecs["shuffle-zstd with bitshuffle"] = Blosc(
        cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE, typesize=2, blocksize=1 << 20
    )
    report = {}
    for label, states in sets.items():
        print(f"\n{label}:")
        report[label] = measure(states, codecs, args.reps)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": report}, indent=2))


def model_states(tokens: int) -> dict:
    import torch

    from hsstore.capture.model.spec import ModelSpec
    from hsstore.capture.run.hooks import LayerCapture
    from hsstore.testing.factories import SHAPES

    config = {**SHAPES["27b"][0], "num_hidden_layers": 4}
    model = ModelSpec("builtin:tiny-qwen3_5", config_overrides=config).load(torch.bfloat16, "cpu", "sdpa")
    ids = torch.randint(0, 250, (1, tokens), generator=torch.Generator().manual_seed(0))
    cap = LayerCapture(model, 4, [1, 3])
    with torch.no_grad():
        out = cap.run(ids, torch.ones_like(ids))
    cap.close()
    return {f"27B-wide model, layer {i}": out[i][0].contiguous() for i in (1, 3)}


def measure(states, codecs: dict, reps: int) -> dict:
    import numpy as np
    import torch

    from hsstore.storage.codecs import chunk_tokens

    tokens, hidden = states.shape
    data = states.view(torch.int16).numpy().view(np.uint16)
    rows = chunk_tokens(hidden, 2)
    chunks = [np.ascontiguousarray(data[i : i + rows]) for i in range(0, tokens - rows + 1, rows)]
    raw = sum(c.nbytes for c in chunks)

    results = {}
    for name, codec in codecs.items():
        encoded = [bytes(codec.encode(c)) for c in chunks]
        for e, c in zip(encoded, chunks):  # lossless, or it is not a candidate
            assert np.array_equal(np.frombuffer(codec.decode(e), dtype=np.uint16).reshape(c.shape), c), name
        enc = dec = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for c in chunks:
                codec.encode(c)
            enc = min(enc, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for e in encoded:
                codec.decode(e)
            dec = min(dec, time.perf_counter() - t0)
        results[name] = {
            "raw_over_size": raw / sum(map(len, encoded)),
            "encode_mb_s": raw / enc / 1e6,
            "decode_mb_s": raw / dec / 1e6,
        }
    base = results["zstd"]["decode_mb_s"]
    print(f"{len(chunks)} chunks of {rows} tokens x {hidden} bf16 ({raw / 1e6:.0f} MB); one thread; best of {reps}")
    print(f"{'codec':40s}{'raw/size':>9}{'encode MB/s':>13}{'decode MB/s':>13}{'decode vs zstd':>16}")
    for name, r in results.items():
        print(
            f"{name:40s}{r['raw_over_size']:>9.3f}{r['encode_mb_s']:>13,.0f}{r['decode_mb_s']:>13,.0f}"
            f"{r['decode_mb_s'] / base:>15.2f}x"
        )
    return results


if __name__ == "__main__":
    main()

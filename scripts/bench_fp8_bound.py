"""The ceiling on FP8 read speed-ups where the disk bounds reads: bytes per token of the bf16 default
codec against the fewest bytes any lossless coder gets FP8 codes down to.

    python scripts/bench_fp8_bound.py --samples 16 --hidden 4096

Where reads are disk-bound, tokens/s is disk bandwidth / bytes per token, so FP8 can read at most
(bf16 bytes with the default codec) / (FP8 bytes) times faster, however fast dequantization is. This
script measures that ratio on the synthetic states of scripts/bench_fp8_read.py (hsstore.testing's
make_data: gaussian x per-channel scales), with FP8 codes from hsstore's quantizer (per-token power-of-
two scales, 4 bytes per token and layer), coded by zstd at levels 1 and 19, LZMA preset 9, and the
order-0 entropy of the code bytes (what an ideal byte-wise entropy coder reaches). The bf16 default
codec is reproduced as the store writes it (byte shuffle in 1 MiB blocks, then zstd-1); its size is
also printed beside the store's own figure in docs/benchmarks.md as a cross-check.
"""

from __future__ import annotations

import argparse
import json
import lzma

import numpy as np
import torch
from numcodecs import Shuffle, Zstd

from hsstore.core import quant
from hsstore.storage.codecs import SHUFFLE_BLOCK_BYTES
from hsstore.testing.factories import make_data


def entropy_bytes(codes: np.ndarray) -> float:
    """Bytes an ideal order-0 coder needs for ``codes`` (uint8)."""
    counts = np.bincount(codes.reshape(-1), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(counts[counts > 0] * np.log2(p)).sum() / 8)


def blocks(buf: bytes, size: int = SHUFFLE_BLOCK_BYTES) -> list[bytes]:
    return [buf[i : i + size] for i in range(0, len(buf), size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    _, states = make_data(a.samples, a.hidden, a.seed)
    sizes = {
        "raw bf16": 0.0,
        "bf16 default (shuffle + zstd-1)": 0.0,
        "bf16 shuffle + zstd-19": 0.0,
        "fp8 none": 0.0,
        "fp8 zstd-1": 0.0,
        "fp8 zstd-19": 0.0,
        "fp8 lzma-9": 0.0,
        "fp8 order-0 entropy": 0.0,
    }
    tokens = 0
    for st in states:
        T, n, H = st.shape
        tokens += T
        for j in range(n):  # one layer at a time, as the store keeps them
            x = st[:, j].contiguous()
            raw = x.view(torch.int16).numpy().tobytes()
            sizes["raw bf16"] += len(raw)
            shuffled = [Shuffle(elementsize=2).encode(b) for b in blocks(raw)]
            sizes["bf16 default (shuffle + zstd-1)"] += sum(len(Zstd(level=1).encode(b)) for b in shuffled)
            sizes["bf16 shuffle + zstd-19"] += sum(len(Zstd(level=19).encode(b)) for b in shuffled)
            q = quant.quantize(x)
            codes = q.codes.numpy()
            scale_bytes = q.scales.numel() * 4
            cb = codes.tobytes()
            sizes["fp8 none"] += len(cb) + scale_bytes
            sizes["fp8 zstd-1"] += sum(len(Zstd(level=1).encode(b)) for b in blocks(cb)) + scale_bytes
            sizes["fp8 zstd-19"] += sum(len(Zstd(level=19).encode(b)) for b in blocks(cb)) + scale_bytes
            sizes["fp8 lzma-9"] += len(lzma.compress(cb, preset=9)) + scale_bytes
            sizes["fp8 order-0 entropy"] += entropy_bytes(codes) + scale_bytes
    default = sizes["bf16 default (shuffle + zstd-1)"]
    best_fp8 = min(v for k, v in sizes.items() if k.startswith("fp8"))
    print(f"{a.samples} samples, {tokens:,} tokens, hidden {a.hidden}, {n} layers")
    print(f"{'format':34s} {'bytes/token':>12s} {'x smaller than raw bf16':>24s} {'x fewer than bf16 default':>26s}")
    for k, v in sizes.items():
        print(f"{k:34s} {v / tokens:12,.0f} {sizes['raw bf16'] / v:24.2f} {default / v:26.2f}")
    print(f"ceiling on disk-bound FP8 read speed-up over the bf16 default codec: {default / best_fp8:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "samples": a.samples,
                    "hidden": a.hidden,
                    "tokens": tokens,
                    "layers": n,
                    "bytes": sizes,
                    "ceiling": default / best_fp8,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()

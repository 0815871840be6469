"""The diff's per-value arithmetic per value pair, one thread, on blocks shaped like the diff's: on torch's path
(what a diff uses where no C compiler built its loops) the bf16 ULP buckets (the int16 path, and the float path kept
for blocks holding a NaN) and the rest of a block's sums (``_block``); and the C fused pass a row (``fused_rows``),
which gives all of them at once: bf16 vs bf16 with the ULP buckets, and bf16 vs fp32 (sums only).

    python scripts/bench_ulp.py --hidden 512 2048 --repeats 7

States: synthetic residual-stream-like rows (per-channel scales), B rounded to bf16 and A = B plus noise of
``--noise`` relative size rounded to bf16, as ``bench_diff.py``'s bf16 variants. Reported: the best of
``--repeats`` medians (``torch.utils.benchmark``), in ns a value pair.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils import benchmark

from hsstore.compare import kernel


def block(hidden: int, noise: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two bf16 blocks ``[rows, hidden]`` of ``kernel.BLOCK_VALUES`` values: A = B + noise."""
    g = torch.Generator().manual_seed(seed)
    rows = kernel.BLOCK_VALUES // hidden
    scale = torch.exp(torch.randn(hidden, generator=g))
    ref = torch.randn(rows, hidden, generator=g) * scale
    return (ref + noise * torch.randn(rows, hidden, generator=g) * scale).bfloat16(), ref.bfloat16()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--noise", type=float, default=2e-3)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loops = kernel.compiled_kernel()
    for hidden in args.hidden:
        a, b = block(hidden, args.noise)
        ws, sums = kernel.Workspace("cpu", compiled=False), torch.empty(7, a.shape[0])
        kernel._block(a, b, sums, ws)
        assert torch.equal(kernel._ulp_counts(a, b, ws, sums), kernel._ulp_counts_float(a, b, ws))  # the same counts
        bits, counts = (a.view(torch.int16).numpy(), b.view(torch.int16).numpy()), np.zeros(6, np.int64)
        cases = {
            "torch int16": lambda: kernel._ulp_counts(a, b, ws, sums),
            "torch float (NaN blocks; before)": lambda: kernel._ulp_counts_float(a, b, ws),
            "_block (the rest)": lambda: kernel._block(a, b, sums, ws),
        }
        if loops:
            out, b32 = np.zeros((7, a.shape[0]), np.float32), b.float().numpy()
            cases["C fused, bf16 vs bf16 (sums + ULP buckets)"] = lambda: loops.fused_rows(*bits, True, out, counts)
            cases["C fused, bf16 vs fp32 (sums)"] = lambda: loops.fused_rows(bits[0], b32, False, out, counts)
        best = {
            name: min(
                benchmark.Timer("fn()", globals={"fn": fn}, num_threads=1).blocked_autorange(min_run_time=0.2).median
                for _ in range(args.repeats)
            )
            for name, fn in cases.items()
        }
        print(
            f"{a.shape[0]}x{hidden}: " + "; ".join(f"{name} {t / a.numel() * 1e9:.2f} ns" for name, t in best.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()

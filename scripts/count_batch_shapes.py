"""How many distinct padded batch shapes a build plans, with and without bucketed padding (CPU, no model).

    python scripts/count_batch_shapes.py --rows 96,1000,10000,100000 --budget 16384

On a fresh host every new shape compiles and autotunes GPU kernels (~6 s a shape for the 27B-shaped
hybrid on an H200, docs/benchmarks.md); bucketing pads each batch to one of 16 lengths per octave,
which bounds the shapes of a build however many rows it has. Row lengths are log-normal (median ~545
tokens, 16..4096), seeded.
"""

from __future__ import annotations

import argparse

import numpy as np

from hsstore.core.batching import POLICY, batch_shapes, padded_length, token_budget_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="96,1000,10000,100000")
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"token budget {args.budget}; bucketed = {POLICY}")
    print(
        f"{'rows':>8} {'plain batches':>14} {'plain shapes':>13} {'bucketed batches':>17} {'bucketed shapes':>16}"
        f" {'padding +%':>11}"
    )
    for n in (int(x) for x in args.rows.split(",")):
        lengths = np.clip(rng.lognormal(6.3, 0.9, n).astype(int), 16, 4096).tolist()
        row, padded = [], []
        for bucketed in (False, True):
            batches = token_budget_batches(lengths, args.budget, bucketed=bucketed)
            row += [len(batches), len(batch_shapes(lengths, batches, bucketed=bucketed))]
            width = padded_length if bucketed else int
            padded.append(sum(len(b) * width(max(lengths[i] for i in b)) for b in batches))
        plain_tok, buck_tok = padded
        print(f"{n:>8} {row[0]:>14} {row[1]:>13} {row[2]:>17} {row[3]:>16} {100 * (buck_tok / plain_tok - 1):>10.1f}%")


if __name__ == "__main__":
    main()

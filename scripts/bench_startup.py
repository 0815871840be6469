"""Start-up cost of the CLI, of reading metadata and of checking a small store: `hsstore --help`,
`hsstore info STORE` and `hsstore verify STORE`, this tree against a baseline commit, timed in the same
run (median of repeats; the machine is noisy), with the heavy packages each command really imports.

The baseline is checked out into a temporary git worktree and run with the same interpreter (its package
on PYTHONPATH), so both sides see the same installed torch/zarr/transformers.

    python scripts/bench_startup.py --baseline 1b276ea --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hsstore.testing.bench import baseline_tree

REPO = Path(__file__).resolve().parents[1]


def _time(cmd: list[str], env: dict[str, str], repeats: int, cwd: str) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=cwd)  # not the repo: -m puts cwd first
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _heavy_imports(argv: list[str], env: dict[str, str], cwd: str) -> list[str]:
    """Which heavy packages the command really imports (read from ``python -X importtime``)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hsstore", *argv], env=env, cwd=cwd, capture_output=True, text=True
    )
    names = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return [m for m in ("torch", "torch.distributed", "zarr", "transformers", "datasets", "numpy") if m in names]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="1b276ea", help="git commit to compare with")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--store", default=None, help="a store for `info` (default: tests/data/format-v1.zarr)")
    args = ap.parse_args()
    store = args.store or str(REPO / "tests" / "data" / "format-v1.zarr")
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(REPO, args.baseline, tmp) as base:
        print(f"median of {args.repeats} runs; baseline {args.baseline}")
        for name, argv in (
            ("hsstore --help", ["--help"]),
            ("hsstore info", ["info", store]),
            ("hsstore verify", ["verify", store]),
        ):
            row = []
            for label, tree in (("baseline", base), ("this tree", REPO)):
                env = {**os.environ, "PYTHONPATH": str(tree)}
                row.append(_time([sys.executable, "-m", "hsstore", *argv], env, args.repeats, tmp))
                print(
                    f"  {name:16s} {label:10s} {row[-1]:6.2f} s  loads: {', '.join(_heavy_imports(argv, env, tmp)) or '-'}"
                )
            print(f"  {name:16s} speed-up {row[0] / row[1]:.1f}x")


if __name__ == "__main__":
    main()

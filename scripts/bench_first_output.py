"""How long `hsstore build` shows nothing: seconds from launch to its first line of output (stdout or
stderr), this tree against a baseline commit, measured in the same run (median of repeats; the machine is
noisy). Each build is stopped (SIGTERM) as soon as its first line arrives, so nothing is built.

    python scripts/bench_first_output.py --baseline bf90d25 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hsstore.testing.bench import baseline_tree

REPO = Path(__file__).resolve().parents[1]


def _first_line(tree: Path, tmp: str) -> tuple[float, str]:
    """(seconds to the first output line, that line) of one build of manifests/tiny.toml from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    store = tempfile.mkdtemp(dir=tmp) + "/s.zarr"
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hsstore",
            "build",
            str(tree / "manifests" / "tiny.toml"),
            "--limit",
            "2",
            "--dtype",
            "bf16",
            "--store",
            store,
        ],
        cwd=tmp,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    sel.register(p.stderr, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                line = key.fileobj.readline()
                if line:
                    return time.perf_counter() - t0, line.rstrip()
            if p.poll() is not None:
                return time.perf_counter() - t0, "(exited without output)"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="bf90d25", help="git commit to compare with")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(REPO, args.baseline, tmp) as base:
        print(f"hsstore build manifests/tiny.toml: seconds to the first output line, median of {args.repeats}")
        medians = []
        for label, tree in (("baseline " + args.baseline, base), ("this tree", REPO)):
            runs = [_first_line(tree, tmp) for _ in range(args.repeats)]
            medians.append(statistics.median(t for t, _ in runs))
            print(f"  {label:18s} {medians[-1]:6.2f} s  first line: {runs[0][1][:90]}")
        print(f"  this tree shows its first line in {medians[1] / medians[0]:.2f}x the baseline's time")


if __name__ == "__main__":
    main()

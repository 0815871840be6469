"""Opening a variant of many tiny samples (issue 38): time and peak RSS of opening HiddenStateDataset and
StreamingHiddenStateDataset, each in a fresh process, this tree against a baseline commit in the same run,
beside the floor of merely listing and reading the commit files; and `verify`'s time per sample.

Stores are written straight through the UnitWriter (hsstore.testing.bench.write_tiny_store: 4-token
samples, ``--unit-samples`` to a unit) and kept in ``--dir`` for the next run. RSS is the child's peak
(ru_maxrss) less its RSS after the imports, i.e. what opening adds.

    python scripts/bench_open.py --sizes 10000,100000,1000000 --baseline efc5ed2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hsstore.testing.bench import baseline_tree

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, resource, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
what, path = sys.argv[1], sys.argv[2]
import numpy, torch, hsstore, hsstore.storage.verify as v
from hsstore.storage.store import Store
opens = getattr(hsstore, what) if what.endswith("Dataset") else None  # (its module loaded here, not timed)
base = rss()
t = time.perf_counter()
if what == "floor":  # list the commit records and read their bytes: what any open must do
    n = 0
    for vdir in os.scandir(os.path.join(path, "variants")):
        cdir = os.path.join(vdir.path, "commits")
        if os.path.isdir(cdir):
            for e in os.scandir(cdir):
                with open(e.path, "rb") as f:
                    n += len(f.read())
elif what == "verify":
    n = v.verify(Store.open(path)).samples_checked
else:
    n = len(opens(path))
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "n": n, "mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base}))
"""


def _child(tree: Path, what: str, store: Path) -> dict:
    rest = os.environ.get("PYTHONPATH")  # kept after the tree: packages installed there (a GPU machine's overlay)
    env = {**os.environ, "PYTHONPATH": str(tree) + (os.pathsep + rest if rest else ""), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, what, str(store)], env=env, check=True, capture_output=True, text=True, cwd="/"
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _store(d: Path, n: int, unit_samples: int) -> Path:
    path = d / f"tiny-{n}-u{unit_samples}.zarr"
    done = d / f"{path.name}.complete"
    if not done.exists():
        import shutil

        from hsstore.testing.bench import write_tiny_store

        shutil.rmtree(path, ignore_errors=True)
        t = time.perf_counter()
        write_tiny_store(path, n, unit_samples)
        done.write_text("")
        print(f"  wrote {n} samples in units of {unit_samples} in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def _row(label: str, base: dict, mine: dict, per: int) -> None:
    print(
        f"  {label:32s} baseline {base['s']:7.3f} s {base['mb']:7.1f} MB | this tree {mine['s']:7.3f} s "
        f"{mine['mb']:7.1f} MB | x{base['s'] / max(mine['s'], 1e-9):5.1f} faster, per 1M samples: "
        f"{mine['s'] * 1e6 / per:6.2f} s {mine['mb'] * 1e6 / per:6.1f} MB",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="sample counts, comma-separated")
    ap.add_argument("--unit-samples", type=int, default=1000, help="samples per unit")
    ap.add_argument("--verify-samples", type=int, default=10000, help="size of the store verify runs on (0: skip)")
    ap.add_argument(
        "--baseline",
        default="efc5ed2",
        help="git commit to compare with, or a folder holding that "
        "commit's hsstore/ (where the tree has no git history: `git archive REV hsstore | tar -x -C DIR`)",
    )
    ap.add_argument("--dir", default="/tmp/hsstore-bench-open", help="where the stores are kept")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; baseline {args.baseline}")
    given = Path(args.baseline)
    with (
        tempfile.TemporaryDirectory() as tmp,
        contextlib.nullcontext(given.resolve()) if given.is_dir() else baseline_tree(REPO, args.baseline, tmp) as base,
    ):
        for n in [int(x) for x in args.sizes.split(",")]:
            store = _store(d, n, args.unit_samples)
            floor = _child(REPO, "floor", store)
            print(
                f"{n} samples, {-(-n // args.unit_samples)} units: list + read the commit files {floor['s']:.3f} s",
                flush=True,
            )
            for what in ("HiddenStateDataset", "StreamingHiddenStateDataset"):
                b, m = _child(base, what, store), _child(REPO, what, store)
                assert b["n"] == m["n"] == n, (b, m)
                _row(f"open {what}", b, m, n)
        if args.verify_samples:
            store = _store(d, args.verify_samples, args.unit_samples)
            b, m = _child(base, "verify", store), _child(REPO, "verify", store)
            print(
                f"verify {m['n']} samples: baseline {b['s'] * 1e6 / b['n']:.0f} µs/sample, this tree "
                f"{m['s'] * 1e6 / m['n']:.0f} µs/sample (x{b['s'] / m['s']:.2f})"
            )


if __name__ == "__main__":
    main()

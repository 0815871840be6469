"""What the fsync'd atomic replace costs the files an export writes, one file at a time.

    python scripts/bench_replace_file.py --files 300 --kib 256 --reps 3

Each repetition writes ``--files`` files of ``--kib`` KiB into a fresh directory, two ways, alternating:
  unsynced  a temporary file written with open/write, renamed over the name (the exporter's and the
            --json report's writer before 2026-12-01)
  synced    hsstore.storage.fileio.replace_file: the temporary file written in full and fsync'd,
            renamed, the folder fsync'd (what store puts always did, and every local writer does now)
Prints the best repetition of each, per file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from hsstore.storage.fileio import replace_file


def unsynced(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def synced(path: Path, data: bytes) -> None:
    replace_file(path, data, f".{path.name}.{os.getpid()}.tmp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--kib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    data = os.urandom(args.kib << 10)
    root = Path(tempfile.mkdtemp(dir=args.dir))
    best = {"unsynced": float("inf"), "synced": float("inf")}
    try:
        for rep in range(args.reps):
            order = [("unsynced", unsynced), ("synced", synced)]
            for name, write in order if rep % 2 == 0 else order[::-1]:
                d = root / f"{name}-{rep}"
                d.mkdir()
                t = time.perf_counter()
                for i in range(args.files):
                    write(d / f"data_{i}.ckpt", data)
                best[name] = min(best[name], time.perf_counter() - t)
                shutil.rmtree(d)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, seconds in best.items():
        print(
            f"{name:9s} {args.files} files of {args.kib} KiB: {seconds * 1e3 / args.files:.2f} ms a file "
            f"({seconds:.2f} s)"
        )


if __name__ == "__main__":
    main()

"""What checking a unit's writes costs: the unchecked writev of before, the checked write (all bytes,
xxh3 from the buffers, fsync, size by fstat), and the alternative of re-reading each file.

    python scripts/bench_checked_write.py --tokens 8192 --hidden 5120 --reps 5

One unit of 5 bf16 layers (random states) is encoded once per codec; then, alternating order per
repetition, each layer's shard is written into a fresh directory by
  unchecked  os.writev of the buffers, return counts ignored (hsstore before 2026-12-01)
  fsync      the same, then fsync (what durability alone costs)
  checked    hsstore.storage.fileio.write_file: writev until every byte is written, xxh3 of the
             buffers, fsync, fstat size check
and, after the unchecked write, the file is re-read and its xxh3 computed (what a re-read check would
add). Prints medians per layer file and per unit, and the checked write against the unchecked one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import xxhash

from hsstore.core.dtypes import to_stored
from hsstore.storage.codecs import chunk_tokens
from hsstore.storage.fileio import write_file
from hsstore.storage.shardio import encode_shard


def unchecked(path: str, parts: list, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, len(parts), 512):
            os.writev(fd, parts[i : i + 512])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def reread(path: str) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--codecs", default="shuffle-zstd,none")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    chunk = chunk_tokens(args.hidden, 2)
    print(
        f"one unit: {args.tokens:,} tokens x {args.layers} layers x {args.hidden} bf16 "
        f"({args.tokens * args.hidden * 2 * args.layers / 1e6:.0f} MB raw); {os.cpu_count()} cores; "
        f"medians of {args.reps}; files in {args.dir or tempfile.gettempdir()}"
    )
    for codec in args.codecs.split(","):
        layers = [
            encode_shard(to_stored(torch.randn(args.tokens, args.hidden, generator=g).to(torch.bfloat16)), chunk, codec)
            for _ in range(args.layers)
        ]
        size = sum(memoryview(p).nbytes for parts in layers for p in parts)
        t: dict[str, list[float]] = {"unchecked": [], "fsync": [], "checked": [], "re-read": []}
        modes = ["unchecked", "fsync", "checked"]
        for rep in range(args.reps):
            d = tempfile.mkdtemp(prefix="hsstore-cw-", dir=args.dir)
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                total = reread_s = 0.0
                for j, parts in enumerate(layers):
                    path = os.path.join(d, f"{mode}-{j}")
                    if mode == "checked":
                        total += timed(write_file, path, parts)
                    else:
                        total += timed(unchecked, path, parts, mode == "fsync")
                        reread_s += timed(reread, path) if mode == "unchecked" else 0.0
                t[mode].append(total)
                if mode == "unchecked":
                    t["re-read"].append(reread_s)
            shutil.rmtree(d)
        m = {k: statistics.median(v) for k, v in t.items()}
        print(
            f"{codec:>13}: {size / 1e6:.0f} MB on disk; unit write unchecked {m['unchecked']:.3f}s, "
            f"+fsync {m['fsync']:.3f}s, checked {m['checked']:.3f}s ({m['checked'] / m['unchecked']:.2f}x "
            f"unchecked, {m['checked'] / m['fsync']:.2f}x fsync only); "
            f"a re-read + xxh3 instead would add {m['re-read']:.3f}s"
        )


if __name__ == "__main__":
    main()

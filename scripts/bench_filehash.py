"""How long hashing a checkpoint's weight files takes (every build does it: hsstore/core/keys.py).

    python scripts/bench_filehash.py --kind sparse --total-gb 54 --files 11   # a 54 GB set, no disk
    python scripts/bench_filehash.py --kind real --total-gb 4 --files 4       # real bytes, cold and warm

``sparse`` files are holes: reading them costs the kernel's zero-fill, not the disk, so the number is
the hashing side's ceiling (CPU and memory). ``real`` files hold random bytes; each is evicted from the
page cache (posix_fadvise DONTNEED) before the cold pass, so the cold pass reads the disk; the warm pass
is a second build on the same host. Every pass is timed against a same-run baseline that reads the same
files in the same threads without hashing. Prints one JSON line per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hsstore.core.keys import MAX_THREADS, hash_files

_CHUNK = 16 << 20


def _read_only(path: Path) -> int:
    buf = memoryview(bytearray(_CHUNK))
    n = 0
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            n += k
    return n


def _evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _make(d: Path, kind: str, total: int, files: int) -> list[Path]:
    size = total // files
    block = os.urandom(64 << 20)
    out = []
    for i in range(files):
        p = d / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(p, "wb") as f:
            if kind == "sparse":
                f.truncate(size)
            else:
                left = size
                while left:
                    left -= f.write(block[: min(left, len(block))])
        out.append(p)
    return out


def _timed(label: str, fn, paths: list[Path], threads: int) -> dict:
    t0 = time.perf_counter()
    fn()
    s = time.perf_counter() - t0
    gb = sum(p.stat().st_size for p in paths) / 1e9
    return {"pass": label, "threads": threads, "gb": round(gb, 2), "seconds": round(s, 2), "gb_per_s": round(gb / s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("sparse", "real"), default="sparse")
    ap.add_argument("--total-gb", type=float, default=54.0)
    ap.add_argument("--files", type=int, default=11)
    ap.add_argument("--dir", default=None, help="where to create the files (default: a temp dir)")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, MAX_THREADS])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hsstore-bench-hash-", dir=a.dir) as tmp:
        paths = _make(Path(tmp), a.kind, int(a.total_gb * 1e9), a.files)
        for threads in a.threads:
            for label, fn in (
                ("read only (baseline)", lambda: list(ThreadPoolExecutor(threads).map(_read_only, paths))),
                ("xxh3_128 (hash_files)", lambda: hash_files(paths, threads=threads)),
            ):
                if a.kind == "real":
                    _evict(paths)
                    print(
                        json.dumps({"kind": a.kind, "cache": "cold", **_timed(label, fn, paths, threads)}), flush=True
                    )
                print(
                    json.dumps(
                        {
                            "kind": a.kind,
                            "cache": "warm" if a.kind == "real" else "sparse",
                            **_timed(label, fn, paths, threads),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()

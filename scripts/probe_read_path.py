"""Where one reading process's time goes: thread scaling, output allocation, and the disk under the
reader's own access pattern (issue 32's open question: why one rank reads under the disk's rate).

    python3 scripts/bench_read_ranks.py --dir /tmp/rr --samples 80 --hidden 4096 --prepare-only
    python3 scripts/probe_read_path.py --dir /tmp/rr --json out/probe.json

Runs on the stores ``bench_read_ranks.py --prepare-only`` wrote. Three measurements, one process:

- ``warm``: every sample read once more with the page cache warm (no disk), through the reader's
  ``read_groups`` (aux = the first four layers, target = the last), with the reader's threads set to each of
  ``--threads``, outputs in fresh memory (as a training loop gets them) and in one recycled buffer (what
  allocation, page faults and unmapping cost); logical GB/s and user/system CPU seconds per logical GB.
- ``io``: the disk under the reader's pattern, no decoding: each sample's stored byte ranges of every
  layer read with ``preadv`` into scratch on ``--io-threads`` threads, in the streaming dataset's epoch order
  (shuffled inside units) and in file order, with and without the readahead hint; the files evicted
  first, the probe file read before each pass (the disk's own sequential rate, 16 MiB reads).
- ``cold``: the streaming dataset itself, in its epoch order and unshuffled, files evicted first.

Every cold figure is disk bytes/s and its ratio to the probe read just before it.

``--timeline VARIANT`` instead streams that variant once cold (default settings, shuffled) while a thread
samples the block device's counters (``/sys/block/DEV/stat``) every 20 ms, and prints per 100 ms: MB the
disk delivered, its busy share (``io_ticks``), the mean requests in flight, and samples handed out; the
probe file's read is sampled the same way for comparison. It tells a disk left idle (readahead too short)
from a disk busy but slow (the request pattern).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hsstore import StreamingHiddenStateDataset
from hsstore.core import quant
from hsstore.core.partition import epoch_sequence
from hsstore.read import readahead as readahead_module
from hsstore.read.prefetch_reads import Readahead
from hsstore.storage import layout, tensor_reads
from hsstore.storage.reader import VariantReader
from hsstore.storage.store import Store
from hsstore.testing.bench import du, evict, probe


def cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def timed(fn: Any) -> dict[str, float]:
    (u0, s0), t0 = cpu(), time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t0
    u1, s1 = cpu()
    gb = n / 1e9
    return {"s": dt, "GB": gb, "GB/s": gb / dt, "user_s/GB": (u1 - u0) / gb, "sys_s/GB": (s1 - s0) / gb}


def open_reader(path: str, vid: str) -> VariantReader:
    return VariantReader(Store.open(path), vid)


def read_all(reader: VariantReader, order: np.ndarray) -> int:
    layers = reader.record.all_layers
    groups = [layers[:-1], layers[-1:]]
    n = 0
    for i in order:
        for t in reader.read_groups(reader.ref(int(i)), groups):
            n += t.numel() * t.element_size()
    return n


class Recycled:
    """``tensor_reads.empty`` replaced by views of one arena reused for every sample (diagnostic only)."""

    def __init__(self, nbytes: int) -> None:
        self.arena = np.empty(nbytes, np.uint8)
        self.arena[:] = 0  # faulted in once
        self.at, self.orig = 0, tensor_reads.empty

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        if self.at + n > self.arena.nbytes:
            self.at = 0
        a = self.arena[self.at : self.at + n].view(dt).reshape(shape)
        self.at += n
        return a, torch.from_numpy(a.view(np.int16) if dt == np.uint16 else a)


def warm(path: str, vid: str, threads: list[int], order: np.ndarray) -> list[dict[str, Any]]:
    out = []
    read_all(open_reader(path, vid), order)  # warms the page cache
    for t in threads:
        for recycle in (False, True):
            reader = open_reader(path, vid)
            reader.read_threads = t
            rec = Recycled(256 << 20)
            if recycle:
                tensor_reads.empty = rec.empty
            try:
                r = timed(lambda: read_all(reader, order))
            finally:
                tensor_reads.empty = rec.orig
            out.append({"threads": t, "recycled": recycle, **r})
            print(
                f"warm {vid[:8]} threads {t:2d} {'recycled' if recycle else 'fresh   '} {r['GB/s']:6.2f} GB/s "
                f"user {r['user_s/GB']:.2f} sys {r['sys_s/GB']:.2f} s/GB",
                flush=True,
            )
    return out


def ranges(reader: VariantReader, i: int) -> list[tuple[int, int, int]]:
    """(fd, offset, bytes) of sample ``i``'s stored chunks, every layer."""
    ref = reader.ref(i)
    out = []
    for layer in reader.record.all_layers:
        sh = reader.shard(ref.unit, layout.layer_array(layer))
        lo, hi = ref.offset // sh.chunk_rows, (ref.offset + ref.length - 1) // sh.chunk_rows
        a, b = sh.spans[lo][0], sh.spans[hi][0] + sh.spans[hi][1]
        out.append((sh.src.fd, a, b - a))
    return out


def io_pass(reader: VariantReader, order: np.ndarray, threads: int, hint: bool) -> int:
    local = threading.local()
    tasks = [r for i in order for r in ranges(reader, int(i))]

    def one(task: tuple[int, int, int]) -> int:
        fd, off, n = task
        buf = getattr(local, "buf", None)
        if buf is None or len(buf) < n:
            buf = local.buf = bytearray(max(n, 8 << 20))
        return os.preadv(fd, [memoryview(buf)[:n]], off)

    ahead = Readahead(reader, [reader.ref(int(i)) for i in order], reader.record.all_layers) if hint else None
    try:
        total, per = 0, len(reader.record.all_layers)
        with ThreadPoolExecutor(threads) as pool:
            for k in range(len(order)):
                if ahead is not None:
                    ahead.at(k)
                total += sum(pool.map(one, tasks[k * per : (k + 1) * per]))
        return total
    finally:
        if ahead is not None:
            ahead.close()


def cold_probe(base: Path, files: Path, fn: Any) -> dict[str, Any]:
    disk = probe(base / "probe.bin")
    evict(files)
    r = timed(fn)
    return {**r, "probe_GB/s": disk / 1e9, "x_probe": r["GB/s"] * 1e9 / disk}


def block_device(path: Path) -> str:
    """The /sys/block name of the disk holding ``path`` (a partition's parent disk where needed)."""
    dev = os.stat(path).st_dev
    link = Path(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    return link.name if (link / "stat").exists() and (link / "queue").exists() else link.parent.name


def sample_disk(dev: str, stop: threading.Event, out: list[tuple[float, int, int, int]]) -> None:
    """(time, sectors read, io_ticks ms, in flight) every 20 ms until ``stop``."""
    while not stop.is_set():
        f = Path(f"/sys/block/{dev}/stat").read_text().split()
        out.append((time.perf_counter(), int(f[2]), int(f[9]), int(f[8])))
        time.sleep(0.02)


def timeline(label: str, dev: str, fn: Any) -> None:
    stop, rows, marks = threading.Event(), [], []
    th = threading.Thread(target=sample_disk, args=(dev, stop, rows), daemon=True)
    th.start()
    t0 = time.perf_counter()
    fn(marks)
    stop.set()
    th.join()
    print(f"timeline {label}: {time.perf_counter() - t0:.2f} s")
    print(f"{'t ms':>6} {'disk MB':>8} {'busy %':>7} {'inflight':>9} {'samples':>8}")
    step, at = 0.1, 0
    while at < len(rows) - 1:
        end = at
        while end < len(rows) - 1 and rows[end][0] - rows[at][0] < step:
            end += 1
        (ta, sa, ia, _), (tb, sb, ib, _) = rows[at], rows[end]
        flight = sum(r[3] for r in rows[at : end + 1]) / (end - at + 1)
        done = sum(1 for m in marks if ta <= m < tb)
        print(
            f"{1e3 * (ta - t0):6.0f} {(sb - sa) * 512 / 1e6:8.1f} {100 * (ib - ia) / max(1e-9, 1e3 * (tb - ta)):7.0f}"
            f" {flight:9.1f} {done:8d}"
        )
        at = end


def run_timeline(base: Path, meta: dict[str, Any], name: str, budget_mib: int | None) -> None:
    """One cold stream of ``name`` (readahead budget ``budget_mib``, default: the reader's) after a probe."""
    path, vid = meta["variants"][name]
    dev = block_device(base)
    timeline("probe (16 MiB reads)", dev, lambda marks: probe(base / "probe.bin"))
    default = readahead_module.READAHEAD_BYTES
    if budget_mib is not None:  # the dataset builds its Readahead with this budget
        readahead_module.READAHEAD_BYTES = budget_mib << 20

    def stream(marks: list[float]) -> None:
        for _ in StreamingHiddenStateDataset(path, variant=vid):
            marks.append(time.perf_counter())

    try:
        evict(Path(path))
        timeline(f"{name} stream, cold, readahead {budget_mib or 'default'} MiB", dev, stream)
    finally:
        readahead_module.READAHEAD_BYTES = default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/rr")
    ap.add_argument("--variants", default="bf16-shuffle-zstd,fp8")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--timeline", default="", help="only the disk timeline of one cold stream of these variants")
    ap.add_argument("--readahead-mib", default="", help="with --timeline: also these readahead budgets (a list)")
    ap.add_argument("--json")
    a = ap.parse_args()
    base = Path(a.dir)
    meta = json.loads((base / "variants.json").read_text())
    if a.timeline:
        quant.dequantize_bf16_bits(np.zeros((1, 8), np.uint8), np.ones((1, 1), np.float32))  # numba, untimed
        for name in a.timeline.split(","):
            for mib in [None, *(int(m) for m in a.readahead_mib.split(",") if m)]:
                run_timeline(base, meta, name, mib)
        return
    threads = [int(x) for x in a.threads.split(",")]
    result: dict[str, Any] = {"nproc": os.cpu_count(), "variants": {}}
    for name in a.variants.split(","):
        path, vid = meta["variants"][name]
        reader = open_reader(path, vid)
        sizes: dict[str, int] = {}
        for k in reader.keys:
            sizes[reader.refs[k].unit] = sizes.get(reader.refs[k].unit, 0) + 1
        shuffled = epoch_sequence(list(sizes.values()), 0, 0, True)
        inorder = np.arange(len(reader.keys))
        res: dict[str, Any] = {"warm": warm(path, vid, threads, shuffled)}
        files = Path(path) / "variants" / vid
        stored = du(files)
        for label, order, hint in (
            ("shuffled", shuffled, True),
            ("in-order", inorder, True),
            ("shuffled-nohint", shuffled, False),
        ):
            r = cold_probe(base, files, lambda o=order, h=hint: io_pass(open_reader(path, vid), o, a.io_threads, h))
            res[f"io-{label}"] = r
            print(
                f"io   {name} {label:16s} {r['GB/s']:5.2f} GB/s of disk bytes = {r['x_probe']:.2f}x probe "
                f"{r['probe_GB/s']:.2f}",
                flush=True,
            )
        for label, shuffle in (("shuffled", True), ("in-order", False)):

            def stream(s: bool = shuffle) -> int:
                n = sum(
                    it["aux_hidden"].numel() * 2 + it["target_hidden"].numel() * 2
                    for it in StreamingHiddenStateDataset(path, variant=vid, shuffle=s)
                )
                return n

            r = cold_probe(base, files, stream)
            disk_rate = r["GB/s"] * stored / (r["GB"] * 1e9)  # stored bytes/s (each file read once)
            r.update({"disk_GB/s": disk_rate, "x_probe": disk_rate * 1e9 / (r["probe_GB/s"] * 1e9)})
            res[f"stream-{label}"] = r
            print(
                f"cold {name} stream {label:9s} {r['GB/s']:5.2f} GB/s logical, {disk_rate:.2f} of disk bytes = "
                f"{r['x_probe']:.2f}x probe {r['probe_GB/s']:.2f}; user {r['user_s/GB']:.2f} sys {r['sys_s/GB']:.2f} s/GB",
                flush=True,
            )
        result["variants"][name] = res
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

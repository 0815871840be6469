"""Reads as a node trains: N ranks on one host reading one store, against the disk's own rate, one run.

    python scripts/bench_read_ranks.py --dir /tmp/rr --samples 300 --hidden 4096 --prepare-only
    torchrun --nproc-per-node 8 scripts/bench_read_ranks.py --dir /tmp/rr --json out/r8.json

(without torchrun it runs as one rank). ``--prepare-only`` (or the first run) writes one store of
``samples`` synthetic 8B-shaped samples (scripts/bench_read.py's states: 5 layers, bf16) as a bf16 variant
with the default codec, its FP8 derivative (``hsstore convert``, read dequantized to bf16), and the same
bf16 samples with ``codec = "none"`` in a second store; plus a probe file of ``--probe-gib`` GiB.

Every launch measures the disk: the probe file is evicted from the page cache (os.sync, then
posix_fadvise DONTNEED) and read once with 16 MiB ``preadv`` calls, at the start, at the end, and right
before and after every cold read (the disk's rate drifts by up to 20 % inside one launch on a shared host:
each cold figure is also given against the mean of its own two adjacent probes).
Then, for each variant and each read mode, one epoch per rank, cold (the variant's files evicted first,
by rank 0, between barriers) and warm (read again at once): ``stream`` is one
``StreamingHiddenStateDataset`` epoch per rank iterated directly with its default settings (and with
``--prefetch`` samples read ahead on threads, and with readahead off, if asked; ``fp8-none`` is the FP8 variant with its codes uncompressed, ``convert --codec none``); ``map`` is ``HiddenStateDataset`` through a DataLoader
with ``--workers`` workers over this rank's ``DistributedSampler`` part (shuffled). Timed from one
barrier to the last rank's end. Reported: logical GB/s of states handed out (all ranks together),
disk GB/s (the variant's file bytes, each read once an epoch, over the same time), the disk figure as a
ratio to the best probe of this launch (``x disk``) and, cold, to its adjacent probes (``x adj``), and the
CPU seconds all ranks spent (user + system) per logical GB. ``--read-threads 4,8,16`` adds streaming
epochs with the reader's decode threads set to each count (the default: up to 8).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from hsstore import HiddenStateDataset, StreamingHiddenStateDataset
from hsstore.core import quant
from hsstore.storage.codecs import DEFAULT
from hsstore.storage.convert import convert

try:  # (the script also runs on an older hsstore, to compare in the same launch)
    from hsstore.storage.reader import read_threads, usable_cpus
except ImportError:  # pragma: no cover
    read_threads = usable_cpus = None  # type: ignore[assignment]
from hsstore.testing.bench import du, evict, probe, write_hsstore, write_probe
from hsstore.testing.factories import make_data


def prepare(base: Path, samples: int, hidden: int, probe_gib: float) -> dict[str, Any]:
    """Write the stores and the probe file once; returns (and records) where each variant lives."""
    meta = base / "variants.json"
    if meta.exists():
        return json.loads(meta.read_text())
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    t0 = time.perf_counter()
    data = make_data(samples, hidden)
    (base / "bf16").mkdir()
    (base / "none").mkdir()
    write_hsstore(base / "bf16", *data, DEFAULT)
    write_hsstore(base / "none", *data, "none")
    logical = sum(st.numel() * 2 for st in data[1])
    del data
    path = base / "bf16" / "s.zarr"
    bf16 = sorted(p.name for p in (path / "variants").iterdir())[0]  # the only variant before the convert
    fp8 = convert(f"{path}#{bf16}", "fp8-e4m3").variant
    fp8_none = convert(f"{path}#{bf16}", "fp8-e4m3", codec="none", dest=str(base / "fp8-none" / "s.zarr")).variant
    none_path = base / "none" / "s.zarr"
    none = sorted(p.name for p in (none_path / "variants").iterdir())[0]
    write_probe(base / "probe.bin", int(probe_gib * (1 << 30)))
    out = {
        "logical_bytes": logical,
        "samples": samples,
        "hidden": hidden,
        "prepare_s": time.perf_counter() - t0,
        "variants": {
            f"bf16-{DEFAULT}": [str(path), bf16],
            "bf16-none": [str(none_path), none],
            "fp8": [str(path), fp8],
            "fp8-none": [str(base / "fp8-none" / "s.zarr"), fp8_none],
        },
    }
    meta.write_text(json.dumps(out))
    return out


def world() -> tuple[int, int]:
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def reduce(x: float, op: Any) -> float:
    if not dist.is_initialized():
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return float(t.item())


def state_bytes(item: dict[str, Any]) -> int:
    return sum(item[k].numel() * item[k].element_size() for k in ("aux_hidden", "target_hidden"))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def epoch(
    mode: str,
    path: str,
    vid: str,
    rank: int,
    size: int,
    workers: int,
    prefetch: int | None,
    readahead: bool,
    threads: int | None = None,
) -> int:
    """Read this rank's part of one epoch; returns the state bytes handed out."""
    n = 0
    if mode == "stream":
        more = {} if readahead else {"readahead": False}  # (so the script also runs on code without the option)
        ds = StreamingHiddenStateDataset(
            path, variant=vid, seed=0, rank=rank, world_size=size, prefetch=prefetch, **more
        )
        if threads is not None:
            ds.reader.read_threads = threads
        for item in ds:
            n += state_bytes(item)
        return n
    ds = HiddenStateDataset(path, variant=vid)
    sampler = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=0)
    for item in DataLoader(ds, batch_size=None, sampler=sampler, num_workers=workers):
        n += state_bytes(item)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-read-ranks")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--probe-gib", type=float, default=4.0)
    ap.add_argument("--variants", default=f"bf16-{DEFAULT},fp8,bf16-none")
    ap.add_argument("--modes", default="stream,map")
    ap.add_argument("--workers", default="0", help="DataLoader workers of the map-style reads (a list)")
    ap.add_argument("--prefetch", default="", help="also stream with each of these many samples read ahead (a list)")
    ap.add_argument("--no-readahead", action="store_true", help="also stream with readahead off (the old reads)")
    ap.add_argument("--read-threads", default="", help="also stream with the reader's threads set to each (a list)")
    ap.add_argument("--caches", default="cold,warm")
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    size, rank = world()
    base = Path(args.dir)
    if rank == 0:
        prepare(base, args.samples, args.hidden, args.probe_gib)
    barrier()
    meta = json.loads((base / "variants.json").read_text())
    if args.prepare_only:
        return
    quant.dequantize_bf16_bits(np.zeros((1, 8), np.uint8), np.ones((1, 1), np.float32))  # numba, outside the timing
    disk = [probe(base / "probe.bin")] if rank == 0 else []
    runs = []
    for mode in args.modes.split(","):
        settings = (
            [(0, None, True, None)]
            + [(0, int(p), True, None) for p in args.prefetch.split(",") if p]
            + ([(0, None, False, None)] if args.no_readahead else [])
            + [(0, None, True, int(t)) for t in args.read_threads.split(",") if t]
        )
        if mode == "map":
            settings = [(int(w), None, True, None) for w in args.workers.split(",")]
        for workers, prefetch, readahead, threads in settings:
            for name in args.variants.split(","):
                path, vid = meta["variants"][name]
                on_disk = du(Path(path) / "variants" / vid)
                for cache in args.caches.split(","):
                    barrier()
                    adjacent = []
                    if cache == "cold" and rank == 0:
                        adjacent.append(probe(base / "probe.bin"))
                        evict(Path(path))
                    barrier()
                    t0, c0 = time.perf_counter(), cpu_seconds()
                    got = epoch(mode, path, vid, rank, size, workers, prefetch, readahead, threads)
                    dt = reduce(time.perf_counter() - t0, dist.ReduceOp.MAX)
                    cpu = reduce(cpu_seconds() - c0, dist.ReduceOp.SUM)
                    got = int(reduce(got, dist.ReduceOp.SUM))
                    barrier()
                    if adjacent:
                        adjacent.append(probe(base / "probe.bin"))
                        disk += adjacent
                    runs.append(
                        {
                            "variant": name,
                            "mode": mode,
                            "workers": workers,
                            "prefetch": prefetch,
                            "readahead": readahead if mode == "stream" else None,
                            "read_threads": threads,
                            "cache": cache,
                            "seconds": dt,
                            "cpu_seconds": cpu,
                            "logical_bytes": got,
                            "disk_bytes": on_disk,
                            "adjacent_probes": adjacent,
                        }
                    )
    barrier()
    if rank != 0:
        return
    disk.append(probe(base / "probe.bin"))
    ref = max(disk)
    for r in runs:
        r["logical_GBps"] = r["logical_bytes"] / r["seconds"] / 1e9
        r["disk_GBps"] = r["disk_bytes"] / r["seconds"] / 1e9
        r["disk_ratio"] = r["disk_GBps"] * 1e9 / ref
        adj = r["adjacent_probes"]
        r["disk_ratio_adjacent"] = r["disk_GBps"] * 1e9 / (sum(adj) / len(adj)) if adj else None
        r["cpu_s_per_logical_GB"] = r["cpu_seconds"] / (r["logical_bytes"] / 1e9)
    res = {
        "ranks": size,
        "cpus": os.cpu_count(),
        "read_threads_default": read_threads(usable_cpus()) if read_threads else None,
        "disk_probe_GBps": [d / 1e9 for d in disk],
        **meta,
        "runs": runs,
    }
    print(
        f"{size} rank(s), {os.cpu_count()} CPUs, {res['read_threads_default']} read threads a rank; {meta['samples']} samples, hidden {meta['hidden']}, "
        f"{meta['logical_bytes'] / 1e9:.2f} GB logical; disk probe (16 MiB reads, evicted) "
        f"{', '.join(f'{d / 1e9:.2f}' for d in disk)} GB/s (ratios vs the best)"
    )
    print(
        f"{'variant':<20}{'mode':<8}{'w':>3}{'pf':>4}{'ra':>4}{'thr':>4}{'cache':>6}{'logical GB/s':>14}"
        f"{'disk GB/s':>11}{'x disk':>8}{'x adj':>7}{'CPU s/GB':>10}"
    )
    for r in runs:
        pf = "-" if r["prefetch"] is None else str(r["prefetch"])
        ra = {True: "on", False: "off", None: "-"}[r["readahead"]]
        thr = "-" if r["read_threads"] is None else str(r["read_threads"])
        adj = "-" if r["disk_ratio_adjacent"] is None else f"{r['disk_ratio_adjacent']:.2f}"
        print(
            f"{r['variant']:<20}{r['mode']:<8}{r['workers']:>3}{pf:>4}{ra:>4}{thr:>4}{r['cache']:>6}"
            f"{r['logical_GBps']:14.2f}{r['disk_GBps']:11.2f}{r['disk_ratio']:8.2f}{adj:>7}"
            f"{r['cpu_s_per_logical_GB']:10.2f}"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""Map-style reads against per-sample torch.load on a busy machine: passes interleaved, ratios per round.

    python scripts/bench_item_reads.py --dir /tmp/ir64 --samples 400 --hidden 64 --cache warm --workers 0
    python scripts/bench_item_reads.py --dir /tmp/ir1k --samples 64 --hidden 1024 --cache cold --workers 0,2

The same synthetic samples (scripts/bench_read.py's: 5 bf16 layers) written as one ``torch.save`` file per
sample and as hsstore stores with the default codec and with ``codec = "none"``, and (``--old-chunks``) with
the default codec in the ~1 MiB chunks stores held before chunk rows were capped (``OLD``: 8,192 rows at
hidden 64). Each round reads every
sample once through each reader (one dataset each for the whole run, as a training loop keeps it), in
turn (torch.load first, then the stores), through a DataLoader with
W workers, in sequential and in random order; "cold" evicts the files (os.sync, posix_fadvise DONTNEED)
before each pass. On a machine other jobs share, a slow minute hits every reader of a round alike, so the
per-round ratio (hsstore samples/s over torch.load's) is the figure; the median over rounds is reported,
with the best-of-workers comparison the issue asks for. With 0 workers each pass's CPU-seconds (this
process, all its threads) are reported too, and ``--decode-floor`` times decoding every stored chunk of the
default-codec store once (one thread, warm, into one reused buffer: what an in-order pass cannot do
without), against torch.load's whole pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Subset

from hsstore import HiddenStateDataset
from hsstore.storage import layout
from hsstore.storage.codecs import DEFAULT
from hsstore.testing.bench import TorchDS, evict, write_hsstore, write_torch
from hsstore.testing.factories import make_data

OLD = f"{DEFAULT}@1MiB"  # the default codec in the chunks written before 2026-12-03 (~1 MiB at any hidden size)


def prepare(base: Path, samples: int, hidden: int) -> None:
    if (base / "ready").exists():
        return
    shutil.rmtree(base, ignore_errors=True)
    data = make_data(samples, hidden)
    for name, write in (
        ("torch", write_torch),
        (DEFAULT, lambda d, s, st: write_hsstore(d, s, st, DEFAULT)),
        ("none", lambda d, s, st: write_hsstore(d, s, st, "none")),
        (OLD, lambda d, s, st: write_hsstore(d, s, st, DEFAULT, chunk=(1 << 20) // (hidden * 2))),
    ):
        (base / name).mkdir(parents=True)
        write(base / name, *data)
    (base / "ready").write_text("")


def one_pass(base: Path, name: str, ds: Any, order: list[int], workers: int, cold: bool) -> tuple[float, float]:
    """(samples per second, CPU-seconds of this process) of one pass of ``ds`` over ``order``."""
    if cold:
        evict(base / name)
    loader = DataLoader(Subset(ds, order), batch_size=None, num_workers=workers)
    c0, t0 = os.times(), time.perf_counter()
    for item in loader:
        item["aux_hidden"].reshape(-1)[::4096].float().sum()  # touch: a lazily mapped tensor is read too
    wall, c1 = time.perf_counter() - t0, os.times()
    return len(order) / wall, c1.user + c1.system - c0.user - c0.system


def decode_floor(ds: HiddenStateDataset) -> float:
    """Seconds to decode every chunk of ``ds``'s layer arrays once (read beforehand, one reused buffer)."""
    reader, spent = ds.reader, 0.0
    for unit in reader.units:
        for layer in reader.record.all_layers:
            shard = reader.shard(unit, layout.layer_array(layer))
            out = np.empty((shard.chunk_rows, shard.row_width), shard.dtype)
            for off, nbytes in shard.spans:
                payload = memoryview(shard.src.read(off, nbytes))[:-4]
                t0 = time.perf_counter()
                shard.comp.decode(payload, out=out)
                spent += time.perf_counter() - t0
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-item-reads")
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--cache", choices=("cold", "warm"), default="warm")
    ap.add_argument("--workers", default="0")
    ap.add_argument("--orders", default="seq,random")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old-chunks", action="store_true", help=f"also read the default codec in ~1 MiB chunks ({OLD})")
    ap.add_argument(
        "--decode-floor", action="store_true", help=f"also time decoding every chunk of the {DEFAULT} store once"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = Path(args.dir)
    prepare(base, args.samples, args.hidden)
    n = args.samples
    orders = {"seq": list(range(n)), "random": [int(i) for i in np.random.default_rng(1).permutation(n)]}
    names = ["torch", DEFAULT, "none"] + ([OLD] if args.old_chunks else [])
    # one dataset per reader for the whole run, as a training loop keeps it across epochs
    sets = {
        name: TorchDS(base / name, n) if name == "torch" else HiddenStateDataset(base / name / "s.zarr")
        for name in names
    }
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for order in args.orders.split(","):
            for w in [int(x) for x in args.workers.split(",")]:
                for name in names:
                    if args.cache == "warm":
                        one_pass(base, name, sets[name], orders[order][: min(n, 32)], w, False)  # warm the cache
                    rate, spent = one_pass(base, name, sets[name], orders[order], w, args.cache == "cold")
                    rates.setdefault(f"{name}|{order}|w{w}", []).append(rate)
                    cpu.setdefault(f"{name}|{order}|w{w}", []).append(spent)
    res = {
        "samples": n,
        "hidden": args.hidden,
        "cache": args.cache,
        "rounds": args.rounds,
        "rates": rates,
        "cpu_s": cpu,
        "ratios": {},
    }
    print(
        f"{n} samples, hidden {args.hidden}, 5 bf16 layers, {args.cache}; {args.rounds} rounds, passes interleaved; "
        "samples/s (median) and hsstore / torch.load per round (median [min, max])"
    )
    for order in args.orders.split(","):
        ws = [int(x) for x in args.workers.split(",")]
        for name in names:
            cells = []
            for w in ws:
                mine, ref = rates[f"{name}|{order}|w{w}"], rates[f"torch|{order}|w{w}"]
                r = [a / b for a, b in zip(mine, ref)]
                res["ratios"][f"{name}|{order}|w{w}"] = r
                cells.append(
                    f"w{w} {statistics.median(mine):8.0f}/s {statistics.median(r):5.2f}x [{min(r):.2f}, {max(r):.2f}]"
                    + (f" cpu {statistics.median(cpu[f'{name}|{order}|w0']):.3f} s/pass" if w == 0 else "")
                )
            if len(ws) > 1:  # best of the worker counts, each side its own best, per round
                best = [
                    max(rates[f"{name}|{order}|w{w}"][k] for w in ws) / max(rates[f"torch|{order}|w{w}"][k] for w in ws)
                    for k in range(args.rounds)
                ]
                res["ratios"][f"{name}|{order}|best"] = best
                cells.append(f"best-of-workers {statistics.median(best):5.2f}x")
            print(f"{order:<7}{name:<20}" + "   ".join(cells))
    if args.decode_floor:
        floor = statistics.median(decode_floor(sets[DEFAULT]) for _ in range(3))
        torch_pass = n / statistics.median(rates[f"torch|{args.orders.split(',')[0]}|w{args.workers.split(',')[0]}"])
        res["decode_floor_s"], res["torch_pass_s"] = floor, torch_pass
        print(
            f"{DEFAULT}: decoding every chunk once takes {floor:.3f} s; torch.load's pass {torch_pass:.3f} s "
            f"({floor / torch_pass:.2f}x of it)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""FP8 storage: bytes on disk and read speed through HiddenStateDataset against bf16, one run.

    python scripts/bench_fp8_read.py --dir /tmp/fp8bench --samples 32 --hidden 4096 --reps 3 --workers 0,2

One store: a bf16 variant with the default codec (written by the store's UnitWriter from the same
synthetic states as scripts/bench_read.py: 5 layers, gaussian x per-channel scales), and an FP8 variant
derived from it by ``hsstore convert`` (the library call), so both hold the same samples in the same
units (and an uncompressed FP8 twin in a second store). Each read pass goes through a torch DataLoader with W workers over HiddenStateDataset and
materializes ``aux [T, 4, H]`` and ``target [T, 1, H]`` per sample; FP8 is read dequantized (bf16, the
default) and raw (``raw=True``: e4m3 codes + scales). "cold" evicts the variant's files from the page
cache first (os.sync, then posix_fadvise(DONTNEED) on every file: no root needed, no O_DIRECT), "warm"
does not. Passes alternate between the variants, repeated ``--reps`` times (medians). Also times the
CPU dequantization alone (one thread, bf16 out). Prints tokens/s and the FP8 / bf16 ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset, Store, StreamingHiddenStateDataset
from hsstore.core import quant
from hsstore.storage.codecs import DEFAULT, chunk_tokens
from hsstore.storage.convert import convert
from hsstore.storage.writer import UnitWriter
from hsstore.testing.bench import du, evict
from hsstore.testing.factories import AUX, TARGET, make_data, provenance
from hsstore.testing.factories import BENCH_LAYERS as LAYERS


def build(path: Path, samples, states, codec: str, unit_samples: int = 8) -> tuple[str, str]:
    """The bf16 variant (written as a build writes) and its FP8 derivative (same store, the codec FP8
    codes get for ``codec``), plus an uncompressed FP8 twin in ``path``-none; returns the two ids."""
    store = Store.create(path)
    H = states[0].shape[-1]
    prov = provenance("bf16", tok="bench", layers={"aux": AUX, "target": TARGET}, model="bench")
    vid = store.create_variant(prov, {"aux": AUX, "target": TARGET}, H, "bf16", codec, chunk_tokens(H, 2))
    w = UnitWriter(store, vid, check_health=False)
    for a in range(0, len(samples), unit_samples):
        part = states[a : a + unit_samples]
        w.write(
            samples[a : a + unit_samples], {layer: torch.cat([s[:, j] for s in part]) for j, layer in enumerate(LAYERS)}
        )
    r = convert(f"{path}#{vid}", "fp8-e4m3")
    convert(f"{path}#{vid}", "fp8-e4m3", dest=str(path.with_name(path.name + "-none")), codec="none")
    return vid, r.variant


def read_pass(path: Path, vid: str | None, workers: int, raw: bool, prefetch: int = 0) -> float:
    """Seconds to read every sample: map-style through a DataLoader with ``workers``, or (``prefetch``)
    the streaming dataset in this process with ``prefetch`` samples read ahead on threads."""
    if prefetch:
        ds = StreamingHiddenStateDataset(path, variant=vid, raw=raw, shuffle=False, prefetch=prefetch)
    else:
        ds = HiddenStateDataset(path, variant=vid, raw=raw)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=False)
    t0 = time.perf_counter()
    for item in loader:
        for k in ("aux_hidden", "target_hidden"):  # touch every page
            item[k].reshape(-1).view(torch.uint8)[::4096].sum()
    return time.perf_counter() - t0


def dequant_speed(states: list[torch.Tensor], reps: int, compiled: bool = True) -> float:
    """GB/s of bf16 produced by the CPU dequantization, one thread, [T, 5, H] per sample
    (``compiled=False``: the numpy table path the compiled loop replaced)."""
    torch.set_num_threads(1)
    qs = []
    for st in states:
        T, n, H = st.shape
        q = quant.quantize(st.reshape(T * n, H))
        qs.append((q.codes.numpy().reshape(T, n, H), q.scales.numpy().reshape(T, n, 1)))
    quant.dequantize_bf16_bits(*qs[0], compiled=compiled)  # compile (or load) the loop outside the timing
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for codes, scales in qs:
            quant.dequantize_bf16_bits(codes, scales, compiled=compiled)
        best = min(best, time.perf_counter() - t0)
    return sum(st.numel() * 2 for st in states) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-fp8-bench")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="also read with the streaming dataset, 0 workers, this many samples ahead on threads",
    )
    ap.add_argument("--codec", default=DEFAULT)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    samples, states = make_data(args.samples, args.hidden)
    tokens = sum(s.length for s in samples)
    logical = sum(st.numel() * 2 for st in states)
    path = base / "s.zarr"
    t0 = time.perf_counter()
    bf16, fp8 = build(path, samples, states, args.codec)
    none = path.with_name(path.name + "-none")
    res: dict = {
        "samples": args.samples,
        "hidden": args.hidden,
        "tokens": tokens,
        "logical_bf16_bytes": logical,
        "codec": args.codec,
        "build_seconds": time.perf_counter() - t0,
        "cpus": os.cpu_count(),
        "bytes": {name: du(path / "variants" / v) for name, v in (("bf16", bf16), ("fp8", fp8))},
    }
    res["bytes"]["fp8-none"] = du(none / "variants")
    res["smaller_than_raw_bf16"] = {k: logical / b for k, b in res["bytes"].items()}
    res["dequant_GBps_one_thread"] = dequant_speed(states, args.reps)
    res["dequant_table_path_GBps_one_thread"] = dequant_speed(states, args.reps, compiled=False)
    passes = [
        ("bf16", path, bf16, False),
        ("fp8", path, fp8, False),
        ("fp8-raw", path, fp8, True),
        ("fp8-none", none, None, False),
        ("fp8-none-raw", none, None, True),
    ]
    for w in runs(args):
        for cache in ("cold", "warm"):
            times: dict[str, list[float]] = {p[0]: [] for p in passes}
            for _ in range(args.reps):  # alternating order, repeated
                for name, where, vid, raw in passes:
                    if cache == "cold":
                        evict(where)
                    times[name].append(read_pass(where, vid, *((0, raw, args.prefetch) if w == "p" else (w, raw))))
            for name in times:
                res[f"{name}_{cache}_w{w}_tokens_per_s"] = tokens / statistics.median(times[name])
            for name in ("fp8", "fp8-raw", "fp8-none", "fp8-none-raw"):
                res[f"{name}_over_bf16_{cache}_w{w}"] = (
                    res[f"{name}_{cache}_w{w}_tokens_per_s"] / res[f"bf16_{cache}_w{w}_tokens_per_s"]
                )
    report(res, args)


def runs(args: argparse.Namespace) -> list:
    """The DataLoader worker counts to run, then "p" for the streaming dataset with prefetch threads."""
    return [int(x) for x in args.workers.split(",")] + (["p"] if args.prefetch else [])


def report(res: dict, args: argparse.Namespace) -> None:
    print(
        f"{res['samples']} samples, {res['tokens']:,} tokens, hidden {res['hidden']}, 5 layers; codec {res['codec']}; "
        f"{res['cpus']} CPUs; medians of {args.reps}"
    )
    sizes = ", ".join(
        f"{k} {b / 1e6:,.0f} MB ({res['smaller_than_raw_bf16'][k]:.2f}x smaller than raw bf16)"
        for k, b in res["bytes"].items()
    )
    print(f"bytes on disk: {sizes}")
    print(
        f"CPU dequantization, one thread: {res['dequant_GBps_one_thread']:.2f} GB/s of bf16 "
        f"(the numpy table path: {res['dequant_table_path_GBps_one_thread']:.2f})"
    )
    names = ("fp8", "fp8-raw", "fp8-none", "fp8-none-raw")
    print(f"{'workers':>8}{'cache':>7}{'bf16 tok/s':>12}" + "".join(f"{n + ' (x)':>20}" for n in names))
    for w in runs(args):
        for cache in ("cold", "warm"):
            cells = "".join(
                f"{res[f'{n}_{cache}_w{w}_tokens_per_s']:12,.0f} ({res[f'{n}_over_bf16_{cache}_w{w}']:4.2f})"
                for n in names
            )
            print(
                f"{w if w != 'p' else 'pf' + str(args.prefetch):>8}{cache:>7}{res[f'bf16_{cache}_w{w}_tokens_per_s']:12,.0f}{cells}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

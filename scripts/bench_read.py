"""Read / write / disk benchmark: hsstore vs the formats drafter pipelines use today, in one run.

    python scripts/bench_read.py --dir /tmp/hsbench --samples 32 --hidden 4096 --reps 3 --workers 0,2

Same logical data for every format: ``samples`` ragged sequences, 5 layers (4 aux + 1 target) of bf16
states ``[T, H]`` each, plus token ids. Formats: a raw numpy memmap (the practical ceiling), one
``torch.save`` file per sample (SpecForge / EAGLE / Model-Optimizer style), one safetensors file per
sample (speculators style), and hsstore with each codec. Each read pass goes through a torch
DataLoader with W workers and materializes ``aux [T, 4, H]`` and ``target [T, 1, H]`` per sample;
"cold" evicts the files from the page cache first (posix_fadvise DONTNEED), "warm" does not.
Prints MB/s of logical state bytes (medians over reps) and ratios against memmap and torch.save.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hsstore import HiddenStateDataset
from hsstore.testing.bench import du, evict, write_hsstore
from hsstore.testing.factories import BENCH_LAYERS as LAYERS
from hsstore.testing.factories import make_data


# ---- writers ---------------------------------------------------------------------------------------
def write_memmap(d: Path, samples, states) -> None:
    lengths = np.array([s.length for s in samples])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    H = states[0].shape[-1]
    mm = np.lib.format.open_memmap(
        d / "states.npy", mode="w+", dtype=np.uint16, shape=(len(LAYERS), int(offsets[-1]), int(H))
    )
    for i, st in enumerate(states):
        mm[:, offsets[i] : offsets[i + 1]] = st.view(torch.uint16).numpy().transpose(1, 0, 2)
    mm.flush()
    np.save(d / "offsets.npy", offsets)


def write_torch(d: Path, samples, states) -> None:
    for i, (s, st) in enumerate(zip(samples, states)):
        torch.save(
            {
                "input_ids": torch.from_numpy(s.input_ids),
                "aux_hidden": st[:, :4].clone(),
                "target_hidden": st[:, 4:].clone(),
            },
            d / f"{i}.pt",
        )


def write_safetensors(d: Path, samples, states) -> None:
    from safetensors.torch import save_file

    for i, (s, st) in enumerate(zip(samples, states)):
        save_file(
            {
                "input_ids": torch.from_numpy(s.input_ids),
                "aux_hidden": st[:, :4].contiguous(),
                "target_hidden": st[:, 4:].contiguous(),
            },
            str(d / f"{i}.safetensors"),
        )


# ---- readers (map-style datasets returning the same materialized tensors) ------------------------
class MemmapDS(Dataset):
    def __init__(self, d: Path, layers: list[int]) -> None:
        self.d, self.idx = d, [LAYERS.index(i) for i in layers]
        self.offsets = np.load(d / "offsets.npy")
        self.mm = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict:
        if self.mm is None:
            self.mm = np.load(self.d / "states.npy", mmap_mode="r")
        a, b = self.offsets[i], self.offsets[i + 1]
        x = torch.from_numpy(np.stack([self.mm[j, a:b] for j in self.idx], axis=1)).view(torch.bfloat16)
        return {"aux_hidden": x[:, :-1], "target_hidden": x[:, -1:]}


class TorchDS(Dataset):
    def __init__(self, d: Path, n: int) -> None:
        self.d, self.n = d, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return torch.load(self.d / f"{i}.pt", weights_only=True)


class SafetensorsDS(TorchDS):
    def __getitem__(self, i: int) -> dict:
        from safetensors.torch import load_file

        return load_file(str(self.d / f"{i}.safetensors"))


def serial_reader(d: Path, layers: list[int]) -> HiddenStateDataset:
    ds = HiddenStateDataset(d / "s.zarr", layers=layers)
    ds.reader.read_threads = 1  # layers one after the other, as before the layer-parallel read
    return ds


def read_pass(ds: Dataset, workers: int, order: list[int]) -> float:
    loader = DataLoader(
        torch.utils.data.Subset(ds, order), batch_size=None, num_workers=workers, persistent_workers=False
    )
    t0 = time.perf_counter()
    for item in loader:
        for k in ("aux_hidden", "target_hidden"):  # touch every page: a lazily mapped tensor must be read too
            item[k].reshape(-1)[::2048].float().sum()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-bench")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--codecs", default="none,zstd,shuffle-zstd,blosc-lz4")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--serial",
        action="store_true",
        help="also read each hsstore store with one thread per sample (the layer-parallel read's baseline)",
    )
    args = ap.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    samples, states = make_data(args.samples, args.hidden)
    logical = sum(st.numel() * 2 for st in states)
    rng = np.random.default_rng(1)
    seq = list(range(len(samples)))
    rnd = [int(i) for i in rng.permutation(len(samples))]
    formats = {
        "memmap": (write_memmap, lambda d, L: MemmapDS(d, L)),
        "torch.save": (write_torch, lambda d, L: TorchDS(d, len(samples))),
        "safetensors": (write_safetensors, lambda d, L: SafetensorsDS(d, len(samples))),
    }
    for c in args.codecs.split(","):
        formats[f"hsstore-{c}"] = (
            lambda d, s, st, c=c: write_hsstore(d, s, st, c),
            lambda d, L: HiddenStateDataset(d / "s.zarr", layers=L),
        )
        if args.serial:
            formats[f"hsstore-{c}-1t"] = (lambda d, s, st, c=c: write_hsstore(d, s, st, c), serial_reader)
    results: dict = {"logical_bytes": logical, "samples": args.samples, "hidden": args.hidden, "rows": {}}
    for name, (write, _) in formats.items():
        d = base / name.replace(".", "_")
        d.mkdir()
        t = []
        for _ in range(args.reps):
            shutil.rmtree(d)
            d.mkdir()
            t0 = time.perf_counter()
            write(d, samples, states)
            os.sync()
            t.append(time.perf_counter() - t0)
        results["rows"][name] = {"write_MBps": logical / statistics.median(t) / 1e6, "bytes_vs_raw": du(d) / logical}
    for workers in [int(w) for w in args.workers.split(",")]:
        for name, (_, reader) in formats.items():
            d = base / name.replace(".", "_")
            row = results["rows"][name]
            for cache in ("cold", "warm"):
                for order_name, order in (("seq", seq), ("random", rnd)):
                    times = []
                    for _ in range(args.reps):
                        if cache == "cold":
                            evict(d)
                        times.append(read_pass(reader(d, LAYERS), workers, order))
                    row[f"{order_name}_{cache}_w{workers}_MBps"] = logical / statistics.median(times) / 1e6
            if name != "torch.save" and name != "safetensors":  # per-sample files hold all layers together
                times = []
                for _ in range(args.reps):
                    evict(d)
                    times.append(read_pass(reader(d, LAYERS[1:]), workers, seq))
                row[f"subset4of5_cold_w{workers}_time_ratio"] = statistics.median(times) / (
                    logical / row[f"seq_cold_w{workers}_MBps"] / 1e6
                )
    report(results, args)


def report(results: dict, args) -> None:
    rows = results["rows"]
    print(
        f"{args.samples} samples, hidden {args.hidden}, 5 layers bf16: {results['logical_bytes'] / 1e9:.2f} GB logical; "
        f"medians of {args.reps}; MB/s of logical state bytes"
    )
    for w in [int(x) for x in args.workers.split(",")]:
        print(f"\nworkers={w}")
        print(
            f"{'format':<20}{'write':>8}{'seq cold':>10}{'rand cold':>10}{'seq warm':>10}{'rand warm':>10}"
            f"{'bytes/raw':>10}{'4of5 t':>8}{'vs mmap':>9}{'vs t.save':>10}"
        )
        for name, r in rows.items():
            sc = r[f"seq_cold_w{w}_MBps"]
            sub = r.get(f"subset4of5_cold_w{w}_time_ratio")
            print(
                f"{name:<20}{r['write_MBps']:8.0f}{sc:10.0f}{r[f'random_cold_w{w}_MBps']:10.0f}"
                f"{r[f'seq_warm_w{w}_MBps']:10.0f}{r[f'random_warm_w{w}_MBps']:10.0f}{r['bytes_vs_raw']:10.2f}"
                f"{(f'{sub:.2f}' if sub else '-'):>8}{sc / rows['memmap'][f'seq_cold_w{w}_MBps']:9.2f}"
                f"{sc / rows['torch.save'][f'seq_cold_w{w}_MBps']:10.2f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

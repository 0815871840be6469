"""Run under torchrun by tests/read/test_streaming.py: streams a store through DataLoader workers per rank and
writes what each rank saw (full epochs, a partial epoch with its state, or a resumed epoch). An optional
fourth argument "spawn" gives each rank persistent spawned workers (one loader for all its epochs)."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from hsstore import StreamingHiddenStateDataset


def keys_of(ds: StreamingHiddenStateDataset, loader: DataLoader, stop_after: int | None = None) -> list[str]:
    seen = []
    for step, batch in enumerate(loader):
        if stop_after is not None and step >= stop_after:
            break
        seen += batch["key"]
        ds.mark_consumed(batch)
    return seen


def main(store: str, out: str, modes: str, context: str = "fork") -> None:
    """``modes``: comma-separated, run one after another on one dataset and loader (persistent spawned workers
    serve them all: each spawned worker imports torch, seconds of CPU) in this one process group (one launch)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # world_size given and the rank left to the process group, as a launcher script often does
    ds = StreamingHiddenStateDataset(
        store, variant="dtype=bf16", seed=7, batch_tokens=600, layers=[3], world_size=dist.get_world_size()
    )
    spawn = {"multiprocessing_context": "spawn", "persistent_workers": True} if context == "spawn" else {}
    loader = DataLoader(ds, batch_size=None, num_workers=2, **spawn)
    for mode in modes.split(","):
        run(ds, loader, out, mode, rank)
    dist.destroy_process_group()


def run(ds: StreamingHiddenStateDataset, loader: DataLoader, out: str, mode: str, rank: int) -> None:
    """One mode's streaming; what this rank saw goes to ``{out}{mode}-{rank}.json``."""
    result: dict = {"world": dist.get_world_size()}
    if mode == "full":
        for name, epoch in (("epoch0", 0), ("epoch0_again", 0), ("epoch1", 1)):
            ds.set_epoch(epoch)
            result[name] = keys_of(ds, loader)
    elif mode == "partial":
        ds.set_epoch(3)
        result["seen"] = keys_of(ds, loader, stop_after=2)
        result["state"] = ds.state_dict()
    elif mode == "resume":
        with open(f"{out}state.json") as f:
            ds.load_state_dict(json.load(f))
        result["seen"] = keys_of(ds, loader)
    with open(f"{out}{mode}-{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:5])

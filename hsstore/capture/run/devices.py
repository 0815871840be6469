"""Where each rank of a build runs: its rank numbers under torchrun and the devices it binds, checked
against what this machine has (one line naming the fix when a device is missing), and the process group
the ranks meet in."""

from __future__ import annotations

import os
import time
from typing import Any

from hsstore.core.schema.manifest import Manifest
from hsstore.core.errors import BadInput


def dist() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def check_devices(m: Manifest, local_rank: int, world: int) -> list[str]:
    """The devices this rank builds on: ``cuda`` becomes this local rank's GPU, a GPU group is
    ``cuda:i+cuda:j``; BadInput when the machine lacks them (or the fla kernels a build asks for). A CPU
    build never imports torch here: the driver of a build only plans and waits (its worker runs the model)."""
    from hsstore.capture.model.backends import installed

    if "fla" in m.backends and not installed("fla"):
        raise BadInput("backend 'fla' needs the flash-linear-attention kernels, which are not installed here: "
                       "pip install flash-linear-attention fla-core (or use --backend torch)")
    out = []
    for dev in m.devices:
        if dev.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise BadInput(f"device {dev!r} requested but no CUDA GPU is visible here; use --device cpu")
            k, count = m.gpus_per_rank, torch.cuda.device_count()
            if k > 1:
                from hsstore.capture.model.placement import require_accelerate

                require_accelerate()
                first = local_rank * k
                if first + k > count:
                    raise BadInput(f"gpus_per_rank = {k} on local rank {local_rank} needs GPUs {first}..{first + k - 1} "
                                   f"but {count} are visible: run at most {count // k} rank(s) per node "
                                   f"(torchrun --nproc-per-node {max(1, count // k)}) or lower gpus_per_rank")
                group = [f"cuda:{first + i}" for i in range(k)]
                names = {torch.cuda.get_device_name(d) for d in group}
                if len(names) > 1:
                    raise BadInput(f"the GPUs of one rank group differ ({', '.join(sorted(names))}); a model spread "
                                   "over GPUs must run on one kind of GPU — set CUDA_VISIBLE_DEVICES to GPUs of one model")
                dev = "+".join(group)
            elif dev == "cuda":
                dev = f"cuda:{local_rank % torch.cuda.device_count()}" if world > 1 else "cuda:0"
            elif int(dev[5:]) >= torch.cuda.device_count():
                raise BadInput(f"device {dev!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
        out.append(dev)
    return out


def barrier(group: Any) -> None:
    """Wait for every rank, letting stop signals through (a blocking gloo barrier holds them until it ends)."""
    if group is None:
        return
    work = group.barrier(async_op=True)
    while not work.is_completed():
        time.sleep(0.05)
    work.wait()


def process_group(world: int) -> Any:
    """torch.distributed over gloo when under torchrun (it carries only barriers), else None."""
    if world == 1:
        return None
    import torch.distributed

    torch.distributed.init_process_group("gloo")
    return torch.distributed

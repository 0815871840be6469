"""Where a causal LM keeps its decoder layers and final norm, and one model over several GPUs: contiguous stages of decoder layers, balanced by parameter bytes,
placed by transformers/accelerate's ``device_map`` machinery (naive model parallelism).

Each decoder layer runs whole on one GPU and its output is copied to the next stage's GPU, so the
numbers are those of the same kernels on one GPU; only one GPU of a group computes at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from hsstore.core.errors import BadInput

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The ModuleList of decoder layers (``model.model.layers`` for most causal LMs)."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == num_layers and name.split(".")[-1] == "layers":
            if best is None or name.count(".") < best[0].count("."):
                best = (name, mod)
    if best is None:
        raise ValueError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")
    return best[1]


def final_norm(model: nn.Module, num_layers: int) -> nn.Module:
    """The norm applied to the last decoder layer's output (``model.model.norm`` for most causal LMs)."""
    layers = decoder_layers(model, num_layers)
    for mod in model.modules():
        if any(child is layers for child in mod.children()):
            norm = getattr(mod, "norm", None)
            if isinstance(norm, nn.Module):
                return norm
    raise ValueError(f"cannot find the final norm of {type(model).__name__} (expected a `norm` beside its layers)")


def contiguous_split(sizes: Sequence[int], parts: int) -> list[int]:
    """Stage index of each item: ``parts`` contiguous runs (none empty) with near-equal size sums.

    Item i goes to the stage its midpoint falls in when the running total is cut at equal fractions.
    """
    if parts < 1 or parts > len(sizes):
        raise ValueError(f"cannot split {len(sizes)} items into {parts} non-empty stages")
    total = float(sum(sizes)) or 1.0
    out, run = [], 0.0
    for s in sizes:
        out.append(min(parts - 1, int((run + s / 2) / total * parts)))
        run += s
    # every stage non-empty: never skip a stage, and leave enough items for the stages after
    n = len(out)
    for i in range(n):
        out[i] = max(min(out[i], out[i - 1] + 1 if i else 0), parts - (n - i))
    return out


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def device_map(model: PreTrainedModel, num_layers: int, devices: Sequence[str]) -> dict[str, str]:
    """``{module name: device}`` covering every parameter and buffer: the decoder layers in contiguous
    stages (the embedding counted in the first); the embedding, modules registered before the layers
    and buffer-only modules (rotary tables, used before layer 0) on the first device; the rest (final
    norm, lm_head) on the last — lm_head with the embedding when they share a weight."""
    layers = decoder_layers(model, num_layers)
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    layers_name = next(n for n, m in model.named_modules() if m is layers)
    embed = model.get_input_embeddings()
    out = model.get_output_embeddings()  # type: ignore[no-untyped-call]  # unannotated in transformers
    tied = out is not None and getattr(out, "weight", None) is embed.weight
    stage = contiguous_split([_bytes(embed)] + [_bytes(layer) for layer in layers], len(devices))
    dmap = {f"{layers_name}.{i}": devices[stage[i + 1]] for i in range(num_layers)}
    for name, mod in model.named_modules():
        placed = tuple(dmap)
        if not name or any(name == c or name.startswith(c + ".") or c.startswith(name + ".") for c in placed):
            continue  # placed, inside a placed module, or a parent of placed ones (placed through children)
        if next(mod.parameters(), None) is None and next(mod.buffers(), None) is None:
            continue
        first = (
            mod is embed
            or (tied and mod is out)
            or order[name] < order[layers_name]
            or next(mod.parameters(), None) is None
        )
        dmap[name] = devices[0] if first else devices[-1]
    return dmap


def stages(layer_devices: Sequence[str]) -> list[dict[str, Any]]:
    """``[{"device": d, "layers": [first, last]}, ...]`` from each decoder layer's device, for provenance."""
    out: list[dict[str, Any]] = []
    for i, d in enumerate(layer_devices):
        if out and out[-1]["device"] == d:
            out[-1]["layers"][1] = i
        else:
            out.append({"device": d, "layers": [i, i]})
    return out


def require_accelerate() -> Any:
    try:
        import accelerate
    except ImportError:
        raise BadInput(
            "gpus_per_rank > 1 spreads the model with transformers' device_map, which needs "
            "accelerate: pip install 'hsstore[multi-gpu]' (or pip install accelerate)"
        ) from None
    return accelerate


def follow_current_device(model: nn.Module, num_layers: int) -> None:
    """Make each decoder layer's GPU the current device while it runs: kernels that launch on the
    current device (some triton and CUDA extensions) then run where the layer's weights are."""
    import torch

    for layer in decoder_layers(model, num_layers):
        dev = next(layer.parameters()).device
        if dev.type == "cuda":
            layer.register_forward_pre_hook(lambda _m, _a, d=dev: torch.cuda.set_device(d))

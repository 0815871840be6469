"""Damage an export the way a peer tool's bug would: read one sample's file in that tool's layout, change
its states, write it back in the same layout (the layouts of ``tests/interop_files.py``).

Slots are ``aux [T, n, H]`` (None for EAGLE) and ``target [T, H]``, as the tool's loader sees them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Slots = tuple[torch.Tensor | None, torch.Tensor]


def sample_file(fmt: str, root: Path, index: int, key: str) -> Path:
    """The file ``hsstore export`` wrote for the ``index``-th sample (content key ``key``)."""
    return (
        root
        / {
            "specforge": f"rows_0-2000/data_{index}.ckpt",
            "eagle": f"0/data_{index}.ckpt",
            "modelopt": f"{key}.pt",
            "speculators": f"hidden_states/hs_{index}.safetensors",
        }[fmt]
    )


def sidecar(fmt: str, root: Path) -> Path:
    return root.parent / f"{root.name}.hsstore-export.json" if fmt == "eagle" else root / "hsstore-export.json"


def subset(fmt: str, export: Path, dest: Path, picks: list[tuple[int, str]]) -> Path:
    """A copy of ``export`` holding only the samples ``picks`` ((index, key)): a smaller cache of the same
    layout (speculators: every Arrow row stays; rows without a states file are not imported)."""
    dest.mkdir(parents=True)
    if fmt == "speculators":
        for f in export.iterdir():
            if f.is_file():
                shutil.copy2(f, dest / f.name)
    for index, key in picks:
        src = sample_file(fmt, export, index, key)
        out = sample_file(fmt, dest, index, key)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    if fmt != "speculators":
        shutil.copy2(sidecar(fmt, export), sidecar(fmt, dest))
    return dest


def _load(fmt: str, path: Path) -> dict[str, Any]:
    if fmt == "speculators":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, weights_only=True)


def read_slots(fmt: str, path: Path) -> tuple[dict[str, Any], torch.Tensor | None, torch.Tensor]:
    obj = _load(fmt, path)
    if fmt == "speculators":
        hs = obj["hidden_states"]
        return obj, hs[:, :-1].clone(), hs[:, -1].clone()
    if fmt == "specforge":
        t = obj["hidden_state"][0]
        return obj, obj["aux_hidden_state"][0].reshape(t.shape[0], -1, t.shape[-1]).clone(), t.clone()
    if fmt == "modelopt":
        t = obj["hidden_states"]
        return obj, obj["aux_hidden_states"].reshape(t.shape[0], -1, t.shape[-1]).clone(), t.clone()
    return obj, None, obj["hidden_state"].clone()


def write_slots(fmt: str, path: Path, obj: dict[str, Any], aux: torch.Tensor | None, target: torch.Tensor) -> None:
    if fmt == "speculators":
        from safetensors.torch import save_file

        obj["hidden_states"] = torch.cat([aux, target.unsqueeze(1)], dim=1).contiguous()
        save_file(obj, str(path))
        return
    if fmt == "specforge":
        obj["hidden_state"] = target.unsqueeze(0).contiguous()
        obj["aux_hidden_state"] = aux.reshape(aux.shape[0], -1).unsqueeze(0).contiguous()
    elif fmt == "modelopt":
        obj["hidden_states"] = target.contiguous()
        obj["aux_hidden_states"] = aux.reshape(aux.shape[0], -1).contiguous()
    else:
        obj["hidden_state"] = target.contiguous()
    torch.save(obj, path)


def damage(fmt: str, path: Path, change: Callable[[torch.Tensor | None, torch.Tensor], Slots]) -> None:
    """Rewrite one sample file with ``change(aux, target) -> (aux, target)`` applied to its states."""
    obj, aux, target = read_slots(fmt, path)
    aux, target = change(aux, target)
    write_slots(fmt, path, obj, aux, target)

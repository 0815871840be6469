"""Backend forcing and detection: which kernel implementation a loaded model really calls.

transformers binds the gated-delta-rule and causal-conv1d implementations when a modeling module is
imported, preferring the `fla` / `causal_conv1d` packages when importable. So a backend is forced per
process, before transformers is imported: ``torch`` blocks the kernel packages in ``sys.modules``;
``fla`` requires them. After loading, ``bound_kernels`` reads back what is really bound.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from typing import Any

from hsstore.core.errors import BadInput

KERNEL_PACKAGES = ("fla", "causal_conv1d")
# family -> names the implementation is reachable under in a modeling module (globals, or layer attributes
# in older transformers releases)
FAMILIES = {
    "chunk_gated_delta_rule": ("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule"),
    "causal_conv1d": ("causal_conv1d_fn",),
}


def installed(package: str) -> bool:
    if package in sys.modules and sys.modules[package] is None:
        return False
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


# transformers' notice, once per kernel, that a kernel package "is not installed" and it falls back to torch: with
# backend torch, hsstore blocked the package on purpose and records the kernel bound, so the notice (and its
# "install ..." advice) is wrong here and is dropped; every other transformers warning still shows
FALLBACK_NOTICE = "is falling back to its reference PyTorch implementation"
FALLBACK_LOGGER = "transformers.integrations.hub_kernels"


class _ChosenFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return FALLBACK_NOTICE not in record.getMessage()


def force_backend(backend: str) -> None:
    """Make the next transformers import bind ``backend``'s kernels. Call before importing transformers."""
    loaded = [m for m in sys.modules if m.startswith("transformers.models.")]
    if loaded:
        raise RuntimeError(f"force_backend({backend!r}) after transformers modeling modules were imported "
                           f"({loaded[0]}, ...); run it first, in a fresh process")
    if backend == "torch":
        for name in KERNEL_PACKAGES:
            sys.modules[name] = None  # type: ignore[assignment]  # import now raises ImportError
        logging.getLogger(FALLBACK_LOGGER).addFilter(_ChosenFallback())
    elif backend == "fla":
        if not installed("fla"):
            raise BadInput("backend 'fla' needs the flash-linear-attention kernels, which are not installed here: "
                           "pip install flash-linear-attention fla-core (or build with --backend torch)")
    else:
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")


def bind_backend(backend: str) -> None:
    """``force_backend`` in a process that has chosen no backend yet (a fresh worker process); in one that
    has (kernel packages blocked, or modeling modules imported: an inline worker after an earlier build),
    check that its choice is ``backend``, since transformers binds kernels once per process."""
    chose = any(m.startswith("transformers.models.") for m in sys.modules) or any(
        p in sys.modules and sys.modules[p] is None for p in KERNEL_PACKAGES)
    if not chose:
        force_backend(backend)
        return
    if backend not in ("torch", "fla"):
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")
    importable = [p for p in KERNEL_PACKAGES if installed(p)]
    have = "torch" if not importable else "fla" if "fla" in importable else f"mixed ({', '.join(importable)})"
    if have != backend:
        raise BadInput(f"backend {backend!r} cannot run in this process: it already binds {have} kernels "
                       "(transformers binds them once per process); build with a worker process per backend "
                       "(the `hsstore build` command, or hsstore.capture.run.driver.build without inline=True)")


def classify(fn: Any, torch_module: str) -> str:
    """'fla' / 'causal_conv1d' / 'torch' (transformers' reference code) / 'other:<module>'."""
    mod = getattr(fn, "__module__", "") or ""
    if mod.startswith("fla"):
        return "fla"
    if mod.startswith("causal_conv1d"):
        return "causal_conv1d"
    if mod == torch_module or mod.startswith("transformers."):
        return "torch"
    return f"other:{mod}.{getattr(fn, '__qualname__', '?')}"


def _implementation(fn: Any) -> Any:
    try:
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation")
    except (TypeError, ValueError):
        impl = None
    return impl if impl is not None else fn


def bound_kernels(model: Any) -> dict[str, str]:
    """What the loaded model calls for each kernel family ('n/a' where the model has no such layer)."""
    modname = type(model).__module__
    module = sys.modules.get(modname)
    has_linear = any("GatedDeltaNet" in type(m).__name__ or hasattr(m, "chunk_gated_delta_rule") for m in model.modules())
    out: dict[str, str] = {}
    for family, names in FAMILIES.items():
        if not has_linear:
            out[family] = "n/a"
            continue
        found = None
        for m in model.modules():  # older releases bind the function on each layer
            for n in names:
                if callable(getattr(m, n, None)) and not isinstance(getattr(m, n), type):
                    found = getattr(m, n)
                    break
            if found is not None:
                break
        if found is None and module is not None:
            for n in names:
                if callable(getattr(module, n, None)):
                    found = getattr(module, n)
                    break
        out[family] = classify(_implementation(found), modname) if found is not None else "unknown"
    cfg = getattr(model, "config", None)
    out["attention"] = str(getattr(cfg, "_attn_implementation", None) or "unknown")
    return out

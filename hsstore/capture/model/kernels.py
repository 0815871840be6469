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
# the families a decoding step calls instead (generate, after the prompt's forward): the recurrent rule and the
# conv's one-token update. Not part of a capture's record (a capture runs whole sequences).
DECODE_FAMILIES = {
    "recurrent_gated_delta_rule": (
        "torch_recurrent_gated_delta_rule",
        "recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
    ),
    "causal_conv1d_update": ("causal_conv1d_update",),
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
        raise RuntimeError(
            f"force_backend({backend!r}) after transformers modeling modules were imported "
            f"({loaded[0]}, ...); run it first, in a fresh process"
        )
    if backend == "torch":
        for name in KERNEL_PACKAGES:
            sys.modules[name] = None  # type: ignore[assignment]  # import now raises ImportError
        logging.getLogger(FALLBACK_LOGGER).addFilter(_ChosenFallback())
    elif backend == "fla":
        if not installed("fla"):
            raise BadInput(
                "backend 'fla' needs the flash-linear-attention kernels, which are not installed here: "
                "pip install flash-linear-attention fla-core (or build with --backend torch)"
            )
    else:
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")


def bind_backend(backend: str) -> None:
    """``force_backend`` in a process that has chosen no backend yet (a fresh worker process); in one that
    has (kernel packages blocked, or modeling modules imported: an inline worker after an earlier build),
    check that its choice is ``backend``, since transformers binds kernels once per process."""
    chose = any(m.startswith("transformers.models.") for m in sys.modules) or any(
        p in sys.modules and sys.modules[p] is None for p in KERNEL_PACKAGES
    )
    if not chose:
        force_backend(backend)
        return
    if backend not in ("torch", "fla"):
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")
    importable = [p for p in KERNEL_PACKAGES if installed(p)]
    have = "torch" if not importable else "fla" if "fla" in importable else f"mixed ({', '.join(importable)})"
    if have != backend:
        raise BadInput(
            f"backend {backend!r} cannot run in this process: it already binds {have} kernels "
            "(transformers binds them once per process); build with a worker process per backend "
            "(the `hsstore build` command, or hsstore.capture.run.driver.build without inline=True)"
        )


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


def _closure(fn: Any) -> dict[str, Any]:
    try:
        return dict(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        return {}


def _wrapper(fn: Any) -> Any:
    """transformers' kernel wrapper; with the ``kernels`` package installed it sits in a ``Func`` module."""
    if fn is None or inspect.isfunction(fn):
        return fn
    inner = _closure(getattr(type(fn), "forward", None)).get("func")
    return inner if inner is not None else fn


def _implementation(fn: Any, device: str) -> Any:
    """What calling ``fn`` on ``device`` inputs runs: transformers' wrapper calls the kernel package, with its
    torch code as the fallback; since transformers 5.25 only for inputs on the devices it lists for it."""
    fn = _wrapper(fn)
    env = _closure(fn)
    impl = env.get("implementation")
    if impl is None:
        return fn
    devices = env.get("supported_devices")
    if devices is not None and device not in devices:
        return env.get("torch_function", impl)
    return impl


def kernel_devices(model: Any, family: str) -> tuple[str, ...] | None:
    """The devices transformers calls ``family``'s kernel package for (None: every device, or unknown)."""
    devices = _closure(_wrapper(_bound(model, FAMILIES[family]))).get("supported_devices")
    return tuple(devices) if devices is not None else None


def _bound(model: Any, names: tuple[str, ...]) -> Any:
    for m in model.modules():  # older releases bind the function on each layer
        for n in names:
            if callable(getattr(m, n, None)) and not isinstance(getattr(m, n), type):
                return getattr(m, n)
    module = sys.modules.get(type(model).__module__)
    for n in names:
        if module is not None and callable(getattr(module, n, None)):
            return getattr(module, n)
    return None


def device_type(model: Any) -> str:
    p = next(iter(model.parameters()), None)
    return p.device.type if p is not None else "cpu"


def bound_kernels(
    model: Any, device: str | None = None, families: dict[str, tuple[str, ...]] = FAMILIES
) -> dict[str, str]:
    """What the loaded model calls for each kernel family (``FAMILIES``: a forward over whole sequences) on
    ``device`` inputs (default: where its weights are; 'n/a' where the model has no such layer)."""
    modname = type(model).__module__
    where = (device or device_type(model)).split(":")[0]
    has_linear = any(
        "GatedDeltaNet" in type(m).__name__ or hasattr(m, "chunk_gated_delta_rule") for m in model.modules()
    )
    out: dict[str, str] = {}
    for family, names in families.items():
        found = _bound(model, names) if has_linear else None
        out[family] = (
            "n/a"
            if not has_linear
            else (classify(_implementation(found, where), modname) if found is not None else "unknown")
        )
    cfg = getattr(model, "config", None)
    out["attention"] = str(getattr(cfg, "_attn_implementation", None) or "unknown")
    return out


def fla_off_device(model: Any) -> str | None:
    """Why fla is not called where ``model`` runs, when the reason is the device (None otherwise)."""
    where = device_type(model)
    devices = kernel_devices(model, "chunk_gated_delta_rule")
    if devices is None or where in devices:
        return None
    return (
        f"fla does not run on {where}: transformers calls it only for inputs on {', '.join(devices)} and its "
        "torch code for any other; run on one of those devices, or with --backend torch"
    )


def why_not(model: Any, backend: str) -> str:
    """Why ``model`` does not call ``backend``'s gated-delta kernels here, with the fix."""
    off = fla_off_device(model) if backend == "fla" else None
    return off or f"check the {backend} installation (`hsstore env --model ...`)"


ATTENTION_PACKAGES = {"flash_attention_2": "flash_attn"}  # attention implementation -> the package it needs


def require_attention(attn: str | None, fix: str) -> None:
    """BadInput (with ``fix``) when attention ``attn`` needs a package not installed here: transformers >= 5.25
    with the ``kernels`` package would fetch a kernel from the Hugging Face Hub instead (remote code, which
    hsstore does not run unasked, and a network call)."""
    package = ATTENTION_PACKAGES.get(attn or "")
    if package and not installed(package):
        raise BadInput(
            f"attention {attn!r} needs the {package} package, which is not installed here (transformers "
            f"would fetch a kernel from the Hugging Face Hub instead: remote code); {fix}"
        )

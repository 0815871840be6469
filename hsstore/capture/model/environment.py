"""The environment fingerprint: how states are computed (device, dtype, kernels bound, versions, flags)."""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import socket
import subprocess
import sys
from typing import Any

from hsstore.capture.model.kernels import installed
from hsstore.core.errors import BadInput
from hsstore.core.schema.provenance import Batching, Environment, Kernels
from hsstore.core.schema.reports import EnvReport


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    import torch

    from hsstore import __version__

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a str subclass that JSON encoders refuse
        "cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "fla": _version("flash-linear-attention") or _version("fla-core"),
        "causal_conv1d": _version("causal-conv1d") or _version("causal_conv1d"),
        "hsstore": __version__,
    }


def device_info(device: str) -> dict[str, Any]:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(idx)
        cap = ".".join(map(str, torch.cuda.get_device_capability(idx)))
        return {"device": "cuda", "device_index": idx, "device_name": name, "compute_capability": cap}
    return {"device": dev.type, "device_name": platform.processor() or platform.machine()}


def flags() -> dict[str, Any]:
    import torch

    return {
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
    }


def environment(
    device: str, dtype: str, backend: str, kernels: Kernels, batching: Batching, probe: bool = True
) -> Environment:
    """The ``environment`` half of a provenance (DESIGN §1). ``device`` is the type; the index is informational.
    ``probe=False``: the device's type only, its name and index not asked (no CUDA context is made: a plan)."""
    where = device_info(device) if probe else {"device": device.split(":")[0]}
    return Environment(
        **where,
        dtype=dtype,
        backend=backend,
        kernels=kernels,
        versions=versions(),
        flags=flags(),
        batching=batching,
        host=socket.gethostname(),
    )


def machine_report() -> dict[str, Any]:
    """What ``hsstore env`` prints without a model: versions, devices, which kernel packages import."""
    import torch

    return {
        "versions": versions(),
        "flags": flags(),
        "host": socket.gethostname(),
        "cuda_available": torch.cuda.is_available(),
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "kernel_packages_importable": {p: installed(p) for p in ("fla", "causal_conv1d")},
        # gpus_per_rank > 1 (one model over several GPUs) needs transformers' device_map, i.e. accelerate
        "model_parallel_available": installed("accelerate"),
    }


# --- ``hsstore env``: the environment fingerprint, and which kernels a model would bind under a backend.


def _probe_here(model: str | None, backend: str | None, device: str) -> dict[str, Any]:
    from hsstore.capture.model.kernels import force_backend

    if backend:
        force_backend(backend)
    from hsstore.capture.model.environment import machine_report

    out = machine_report()
    out["backend_forced"] = backend or "none (what transformers picks by itself)"
    if model:
        import torch
        from transformers import AutoModelForCausalLM

        from hsstore.capture.model.kernels import bound_kernels
        from hsstore.capture.model.spec import ModelSpec

        spec = ModelSpec(model)
        tok = spec.tokenizer()
        config = spec.config(len(tok))
        with torch.device("meta"):
            m = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # unannotated in transformers
        out["model"] = model
        out["kernels_bound"] = bound_kernels(m, device)
    return out


def probe(model: str | None, backend: str | None, device: str = "cpu") -> EnvReport:
    """What ``hsstore env`` prints, probed in a fresh process (forcing a backend patches what it imports)."""
    if backend not in (None, "torch", "fla"):
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")
    cmd = [sys.executable, "-m", "hsstore.capture.model.environment", json.dumps([model, backend, device])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["probe failed"])[-1]
        raise BadInput(last.removeprefix("error: "))
    return EnvReport.from_json(proc.stdout.encode(), "hsstore env's probe of this machine")


if __name__ == "__main__":
    from hsstore.core.errors import HsstoreError

    try:
        print(json.dumps(_probe_here(*json.loads(sys.argv[1])), default=str))
    except HsstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)

"""``hsstore env``: the environment fingerprint, and which kernels a model would bind under a backend.

The probe runs in a fresh process (the backend must be forced before transformers is imported) and
builds the model on the meta device, so even a 27B model costs no memory and no weights are read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from hsstore.core.errors import BadInput


def _probe_here(model: str | None, backend: str | None, device: str) -> dict[str, Any]:
    from hsstore.capture.model.backends import force_backend

    if backend:
        force_backend(backend)
    from hsstore.capture.model.environment import machine_report

    out = machine_report()
    out["backend_forced"] = backend or "none (what transformers picks by itself)"
    if model:
        import torch
        from transformers import AutoModelForCausalLM

        from hsstore.capture.model.backends import bound_kernels
        from hsstore.capture.model.spec import ModelSpec

        spec = ModelSpec(model)
        tok = spec.tokenizer()
        config = spec.config(len(tok))
        with torch.device("meta"):
            m = AutoModelForCausalLM.from_config(config)
        out["model"] = model
        out["kernels_bound"] = bound_kernels(m, device)
    return out


def probe(model: str | None, backend: str | None, device: str = "cpu") -> dict[str, Any]:
    if backend not in (None, "torch", "fla"):
        raise BadInput(f"unknown backend {backend!r}; choose torch or fla")
    cmd = [sys.executable, "-m", "hsstore.capture.model.probe", json.dumps([model, backend, device])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["probe failed"])[-1]
        raise BadInput(last.removeprefix("error: "))
    return json.loads(proc.stdout)


if __name__ == "__main__":
    from hsstore.core.errors import HsstoreError

    try:
        print(json.dumps(_probe_here(*json.loads(sys.argv[1])), default=str))
    except HsstoreError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)

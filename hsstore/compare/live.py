"""Fingerprint a model already loaded in this process and check it against a variant's provenance.

For eval harnesses that compute states on the fly: the same ProvenanceMismatch as for stored states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsstore.core.provenance_match import flatten, require_match

# environment fields a live model can be fingerprinted on (batching and host are a build's business)
LIVE_FIELDS = ("environment.kernels", "environment.dtype", "environment.device", "environment.device_name",
               "environment.versions", "environment.flags", "recipe.model.config_fingerprint",
               "recipe.model.num_layers", "recipe.model.hidden_size")


def live_fingerprint(model: Any) -> dict[str, Any]:
    """Provenance-shaped dict of what this loaded model computes with (kernels bound, dtype, device, ...)."""
    import torch

    from hsstore.capture.model.backends import bound_kernels
    from hsstore.core.dtypes import name_of
    from hsstore.capture.model.environment import device_info, flags, versions
    from hsstore.capture.model.spec import config_fingerprint, text_config

    p = next(model.parameters())
    tc = text_config(model.config)
    dev = str(p.device) if p.device.type != "cuda" else f"cuda:{p.device.index or 0}"
    env = {**device_info(dev), "dtype": name_of(p.dtype), "kernels": bound_kernels(model), "versions": versions(),
           "flags": flags()}
    env.pop("device_index", None)
    _ = torch  # imported for device_info's CUDA queries
    return {"recipe": {"model": {"config_fingerprint": config_fingerprint(model.config), "num_layers": int(tc.num_hidden_layers),
                                 "hidden_size": int(tc.hidden_size)}},
            "environment": env}


def _restrict(prov: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    flat = flatten(prov)
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if any(k == f or k.startswith(f + ".") for f in fields):
            node = out
            parts = k.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = v
    return out


def check_live_model(model: Any, required: Any, allow_drift: Iterable[str] = ()) -> dict[str, Any]:
    """Raise ProvenanceMismatch if ``model`` would compute states other than ``required``'s
    (a provenance dict, a dataset, or 'STORE#SELECTOR'). Returns the live fingerprint."""
    from hsstore.read.requirement import resolve_provenance

    want = _restrict(resolve_provenance(required), LIVE_FIELDS)
    have = _restrict(live_fingerprint(model), LIVE_FIELDS)
    require_match(have, want, allow_drift, what="live model")
    return have

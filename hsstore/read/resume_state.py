"""The resumable state of a streaming dataset (``state_dict`` / ``load_state_dict``), checked as it is
loaded: a dict of other fields, types or sizes is one BadInput naming what is wrong, never a KeyError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hsstore.core.errors import BadInput

FIELDS = {"epoch": int, "seed": int, "n": int, "variant": str, "consumed": str}
FIX = "pass the dict state_dict() returned"


def consumed_from_state(state: Any, variant: str, n: int, seed: int) -> tuple[int, np.ndarray]:
    """(epoch, consumed marks bool [n]) of ``state``, which must be this dataset's ``state_dict()``."""
    if not isinstance(state, Mapping):
        raise BadInput(f"load_state_dict takes the dict state_dict() returned, not a {type(state).__name__}")
    missing = sorted(set(FIELDS) - set(state))
    if missing:
        raise BadInput(f"state lacks {missing} (has {sorted(map(str, state))}); {FIX}")
    for name, kind in FIELDS.items():
        if not isinstance(state[name], kind) or isinstance(state[name], bool):
            raise BadInput(f"state[{name!r}] is a {type(state[name]).__name__}, not {kind.__name__}; {FIX}")
    if (state["variant"], state["n"], state["seed"]) != (variant, n, seed):
        raise BadInput(f"state is for variant {state['variant']} with {state['n']} samples and seed "
                       f"{state['seed']}; this dataset is {variant} with {n} and seed {seed}")
    try:
        raw = bytes.fromhex(state["consumed"])
    except ValueError:
        raise BadInput(f"state['consumed'] is not the hex string state_dict() writes; {FIX}") from None
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:n]
    if bits.shape[0] != n:
        raise BadInput(f"state['consumed'] marks {bits.shape[0]} samples, not {n}; {FIX}")
    return state["epoch"], bits.astype(bool)

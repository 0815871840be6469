"""The resumable state of a streaming dataset (``state_dict`` / ``load_state_dict``), checked as it is
loaded: a dict of other fields, types or sizes is one BadInput naming what is wrong, never a KeyError.

Format 2 names the samples it marks: the consumed marks are a bitmask over the snapshot the state was saved
over (the committed units, ``units`` = [[unit id, samples it serves], ...] in id order, and their ``digest``),
zlib-compressed and base64-coded (a 5M-sample store gives at most about 0.9 MB; far less at an epoch's
start or end). When the store changed since, the loader re-opens that snapshot's units to turn the marks
into sample keys. The format before (``epoch, seed, n, variant, consumed`` as hex, marks by index) still
loads while the store holds as many samples; it cannot say which samples it meant otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hsstore.core.errors import BadInput

FORMAT = 2
OLD_FIELDS = {"epoch": int, "seed": int, "n": int, "variant": str, "consumed": str}
FIELDS = {**OLD_FIELDS, "format": int, "units": list, "digest": str}
FIX = "pass the dict state_dict() returned"


@dataclass(frozen=True)
class SavedState:
    """A loaded state: its epoch, its marks (bool [n] over its snapshot) and that snapshot (``units`` is
    None for the old format, whose marks are by index)."""

    epoch: int
    consumed: np.ndarray
    units: list[tuple[str, int]] | None
    digest: str | None


def snapshot_digest(units: Sequence[tuple[str, int]]) -> str:
    """The committed set a dataset reads: its units (ascending id) and how many samples each serves."""
    text = "\n".join(f"{u}:{c}" for u, c in units)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pack_marks(bits: np.ndarray) -> str:
    """bool [n] -> the compact text a state holds."""
    return base64.b64encode(zlib.compress(np.packbits(bits).tobytes(), 6)).decode()


def _unpack(text: str, n: int, old: bool) -> np.ndarray:
    try:
        raw = bytes.fromhex(text) if old else zlib.decompress(base64.b64decode(text, validate=True))
    except (ValueError, zlib.error):
        raise BadInput(f"state['consumed'] is not the text state_dict() writes; {FIX}") from None
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:n]
    if bits.shape[0] != n:
        raise BadInput(f"state['consumed'] marks {bits.shape[0]} samples, not {n}; {FIX}")
    return bits.astype(bool)


def _check_fields(state: Any) -> bool:
    """True for the old format; BadInput for anything state_dict() never returned."""
    if not isinstance(state, Mapping):
        raise BadInput(f"load_state_dict takes the dict state_dict() returned, not a {type(state).__name__}")
    old = "format" not in state
    fields = OLD_FIELDS if old else FIELDS
    missing = sorted(set(fields) - set(state))
    if missing:
        raise BadInput(f"state lacks {missing} (has {sorted(map(str, state))}); {FIX}")
    for name, kind in fields.items():
        if not isinstance(state[name], kind) or isinstance(state[name], bool):
            raise BadInput(f"state[{name!r}] is a {type(state[name]).__name__}, not {kind.__name__}; {FIX}")
    if not old and state["format"] != FORMAT:
        raise BadInput(f"state is in format {state['format']}; this hsstore reads format {FORMAT} and the one "
                       "before it: resume with the hsstore that saved it")
    return old


def _units(raw: list) -> list[tuple[str, int]]:
    if not all(isinstance(u, (list, tuple)) and len(u) == 2 and isinstance(u[0], str) and isinstance(u[1], int)
               for u in raw):
        raise BadInput(f"state['units'] is not the [[unit id, samples], ...] list state_dict() writes; {FIX}")
    return [(u, int(c)) for u, c in raw]


def load_state(state: Any, variant: str, n: int, seed: int) -> SavedState:
    """``state`` checked against this dataset (variant, seed; the old format also its sample count)."""
    old = _check_fields(state)
    if (state["variant"], state["seed"]) != (variant, seed):
        raise BadInput(f"state is for variant {state['variant']} with seed {state['seed']}; this dataset is "
                       f"{variant} with seed {seed}")
    if old and state["n"] != n:
        raise BadInput(f"state is in the old format (marks by position, no snapshot) and was saved over "
                       f"{state['n']} samples; the store serves {n} now, so its marks cannot be tied to samples: "
                       "start the epoch over (set_epoch) or resume with a state saved by this hsstore")
    if old:
        return SavedState(state["epoch"], _unpack(state["consumed"], n, True), None, None)
    units = _units(state["units"])
    if sum(c for _, c in units) != state["n"] or snapshot_digest(units) != state["digest"]:
        raise BadInput(f"state['units'] does not add up to its n and digest (edited by hand?); {FIX}")
    return SavedState(state["epoch"], _unpack(state["consumed"], state["n"], False), units, state["digest"])

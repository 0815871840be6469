"""The rule that keeps a drafter's target out of its conditioning: no target state may be computable from an
aux state. In hsstore's layer ids (layer i = output of decoder layer i, ``num_layers`` = after the final
norm) a target is derivable from an aux layer when they are one layer, or when one is the final norm of the
other: ``final_norm`` is RMSNorm(layer ``num_layers - 1``) — aux ``[0, 3]`` with target ``final_norm`` on a
4-layer model hands the drafter its answer up to a per-token scale.
"""

from __future__ import annotations

from collections.abc import Sequence

from hsstore.core.errors import BadInput


def leaks(aux: Sequence[int], target: Sequence[int], num_layers: int) -> list[tuple[int, int]]:
    """(aux layer, target layer) pairs where the target is the aux state or its final norm (either way)."""
    last, norm = num_layers - 1, num_layers
    out = []
    for t in target:
        for a in aux:
            if a == t or {a, t} == {last, norm}:
                out.append((a, t))
    return out


def _name(i: int, num_layers: int) -> str:
    return "final_norm" if i == num_layers else f"layer {i}"


def check_no_leak(aux: Sequence[int], target: Sequence[int], num_layers: int, fix: str) -> None:
    """Refuse (BadInput, exit 2) layer roles where a target is derivable from an aux layer; ``fix`` says how
    to choose other layers in the caller's terms."""
    found = leaks(aux, target, num_layers)
    if not found:
        return
    a, t = found[0]
    if a == t:
        what = f"{_name(t, num_layers)} is both aux and target"
    elif t == num_layers:
        what = f"target final_norm is RMSNorm of aux layer {a}"
    else:
        what = f"aux final_norm is RMSNorm of target layer {t}"
    raise BadInput(f"{what} (on a {num_layers}-layer model final_norm = RMSNorm(layer {num_layers - 1})): the target "
                   f"leaks into the conditioning layers; {fix}")

"""Layer conventions: what another tool's layer id means, mapped onto hsstore's ids — pure functions.

hsstore's layer *i* is the raw output of decoder layer *i* (pre final norm; transformers'
``hidden_states[i+1]``); id ``num_layers`` is the final norm's output. Other tools number differently,
and nothing in their files says which way, so the user states it (``--capture``):

- ``output``: id *i* is the output of decoder layer *i* (SGLang/SpecForge's aux layers,
  Model-Optimizer's ``--aux-layers``, hsstore).
- ``input``: id *i* is the state *entering* layer *i* = output of layer *i-1* (vLLM's
  ``eagle_aux_hidden_state_layer_ids``; id ``num_layers`` is the last layer's output, pre-norm).
- ``unknown``: ids are kept as written and the variant's ``recipe.capture`` says ``unknown``;
  ``hsstore diff --align`` then finds which native layer each one matches.

``final_norm`` (post-norm: transformers' last ``hidden_states`` entry) means the same in every convention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from hsstore.core.errors import BadInput

# --- The rule that keeps a drafter's target out of its conditioning: no target state may be computable from an


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
    raise BadInput(
        f"{what} (on a {num_layers}-layer model final_norm = RMSNorm(layer {num_layers - 1})): the target "
        f"leaks into the conditioning layers; {fix}"
    )


Capture = Literal["output", "input", "unknown"]  # the numbering of stated ids (ImportSource.capture)
CAPTURES: tuple[Capture, ...] = ("output", "input", "unknown")
# the numbering each tool's own configuration uses for layer ids
TOOL_CAPTURE: dict[str, Capture] = {
    "specforge": "output",
    "modelopt": "output",
    "eagle": "output",
    "speculators": "input",
}
FINAL_NORM = "final_norm"
Stated = int | str  # a layer id as the user wrote it: an int, or "final_norm"


def parse_capture(text: str) -> Capture:
    for capture in CAPTURES:
        if text == capture:
            return capture
    raise BadInput(
        f"unknown --capture {text!r}; choose output (id i = output of layer i, SGLang/HF), "
        "input (id i = state entering layer i, vLLM) or unknown"
    )


def parse_layer_list(text: str) -> list[Stated]:
    """``"2,16,29,final_norm"`` -> ``[2, 16, 29, "final_norm"]`` (file slot order: aux layers, then target)."""
    out: list[Stated] = []
    for part in (p.strip() for p in str(text).split(",")):
        if part == FINAL_NORM:
            out.append(FINAL_NORM)
        elif part.lstrip("-").isdigit():
            out.append(int(part))
        else:
            raise BadInput(
                f"--layers part {part!r} is not a layer id; write ids in file order as e.g. "
                f"'2,16,29,{FINAL_NORM}' (integers, or {FINAL_NORM} for the post-norm state)"
            )
    if not out:
        raise BadInput("--layers is empty; name the layer of every state slot in the files, e.g. '2,16,29,36'")
    return out


def to_hsstore(stated: Stated, capture: str, num_layers: int) -> int:
    """One stated id as an hsstore layer id (``unknown`` keeps integers as written)."""
    if not isinstance(num_layers, int) or num_layers < 1:  # (an export record writes -1 for "unknown")
        raise BadInput(
            f"the number of decoder layers is unknown (got {num_layers!r}), so layer {stated!r} cannot be "
            "placed: pass --num-layers N (or --model DIR, the target's folder with config.json)"
        )
    if stated == FINAL_NORM:
        return num_layers
    i = int(stated)
    if capture == "input":
        if not 1 <= i <= num_layers:
            what = "the embedding output, which hsstore does not store" if i == 0 else "out of range"
            raise BadInput(
                f"layer {i} under --capture input is {what} (valid 1..{num_layers} for a "
                f"{num_layers}-layer model: the state entering layer i)"
            )
        return i - 1
    if not 0 <= i < num_layers + (1 if capture == "unknown" else 0):
        top = num_layers if capture == "unknown" else num_layers - 1
        hint = f"; the post-norm state is {FINAL_NORM}" if capture == "output" and i == num_layers else ""
        raise BadInput(f"layer {i} is out of range for a {num_layers}-layer model (valid 0..{top}{hint})")
    return i


def from_hsstore(layer: int, capture: str, num_layers: int) -> Stated:
    """An hsstore id in a tool's numbering (``input``: output of i is the state entering i+1)."""
    if layer == num_layers and capture != "unknown":
        return FINAL_NORM
    return layer + 1 if capture == "input" else layer


def slot_layers(
    stated: Sequence[Stated], n_aux: int, has_target: bool, capture: str, num_layers: int
) -> dict[str, list[int]]:
    """Map the stated ids of a file's slots (``n_aux`` aux slots, then the target slot) to hsstore roles."""
    want = n_aux + (1 if has_target else 0)
    if len(stated) != want:
        slots = f"{n_aux} aux state(s)" + (" and a target state" if has_target else "")
        raise BadInput(
            f"the files hold {slots} per token ({want} slot(s)), but --layers names {len(stated)}: "
            f"{','.join(map(str, stated))}; list one id per slot, aux first, target last"
        )
    ids = [to_hsstore(s, capture, num_layers) for s in stated]
    if len(set(ids)) != len(ids):
        raise BadInput(
            f"--layers {','.join(map(str, stated))} names one layer twice (as hsstore ids under "
            f"--capture {capture}: {ids}); every slot holds a different layer"
        )
    if capture != "unknown":  # unknown: ids as written, not hsstore's layers (diff --align finds what they are)
        check_no_leak(
            ids[:n_aux],
            ids[n_aux:],
            num_layers,
            "these files cannot train a drafter without the target "
            "leaking; check --layers (aux slots first, the target last) and --capture",
        )
    return {"aux": ids[:n_aux], "target": ids[n_aux:]}

"""``hsstore diff A B --align``: which of B's capture points each of A's layers really holds.

Caches of other tools label layers by conventions that are easy to get wrong: vLLM's aux layer i is the
state *entering* layer i (= output of i-1) where transformers' is its output; vLLM's last state is
pre-final-norm where transformers' ``hidden_states[-1]`` is post-norm. B is a native variant (its layer j
is the output of decoder layer j; j = L, the number of layers, is the final norm's output). On shared
samples every layer of A is compared with every layer of B (rel-L2 ||A_i - B_j|| / ||B_j||); the best
match, with its margin over the runner-up, names what A's label i means: as labelled, off by one (the
input convention), or pre- / post-norm swapped.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hsstore.compare.diff import ThreadLocal, map_samples
from hsstore.compare.kernel import C, Workspace, summarize, token_sums
from hsstore.compare.sampling import choose, sample_count
from hsstore.core.errors import BadInput
from hsstore.core.schema.record import or_none
from hsstore.core.schema.reports import AlignLayer, AlignReport
from hsstore.storage.reader import VariantReader

DEFAULT_SAMPLES = 16
MATCH_REL = 0.25  # a best match above this rel-L2 is no match
MARGIN = 2.0  # the runner-up must be this many times further for a clear match


def capture_known(r: VariantReader) -> bool:
    return r.record.prov.recipe.capture == "decoder_layer_output"


def num_layers(b: VariantReader) -> int:
    n = b.record.prov.recipe.model.num_layers
    if not isinstance(n, int):
        raise BadInput(f"B ({b.id}) does not record recipe.model.num_layers; --align needs a native variant as B")
    return n


def point(j: int, n_layers: int) -> str:
    """What B's layer id ``j`` holds, in words."""
    if j == n_layers:
        return "post-final-norm (transformers' hidden_states[-1])"
    if j == n_layers - 1:
        return f"output of the last decoder layer {j} (pre-final-norm)"
    return f"output of decoder layer {j} (= input of layer {j + 1})"


def relation(i: int, j: int, n_layers: int) -> tuple[str, str]:
    """(kind, words) of A's label ``i`` holding B's layer ``j``."""
    if i == j:
        return "as_labelled", f"A's layer {i} is B's layer {j}, as labelled: {point(j, n_layers)}"
    if i == n_layers and j == n_layers - 1:
        return "pre_norm", (
            f"A's layer {i} is PRE-norm (B's layer {j}, the last decoder layer's output) where "
            "post-final-norm is labelled: vLLM's last state is pre-norm (speculators PR #313)"
        )
    if i == n_layers - 1 and j == n_layers:
        return "post_norm", (
            f"A's layer {i} is POST-norm (B's final-norm output, transformers' hidden_states[-1]) "
            "where the last decoder layer's pre-norm output is labelled"
        )
    if j == i - 1:
        return "off_by_one", (
            f"A's layer {i} is B's layer {j}: OFF BY ONE — A holds the state entering layer {i} "
            f"(= output of {j}), the input convention of vLLM aux layers; import with --capture input"
        )
    return "shifted", f"A's layer {i} is B's layer {j} ({point(j, n_layers)}): shifted by {j - i:+d}"


def capture_words(i: int, j: int, n_layers: int) -> str:
    """What stored layer ``i`` holding live capture point ``j`` means, in words: the audit's ``capture_point``
    finding (``relation`` says the same of A's label and B's layer for ``diff --align``)."""
    if j < 0:
        return f"stored layer {i} holds the embeddings, the state entering layer 0 (vLLM's input id 0): " + (
            "OFF BY ONE" if i == 0 else f"shifted by {j - i:+d}"
        )
    if i == n_layers and j == n_layers - 1:
        return (
            f"stored layer {i} (labelled post-final-norm) holds the last decoder layer's output, PRE-norm: "
            "vLLM's last state is pre-norm (speculators PR #313)"
        )
    if i == n_layers - 1 and j == n_layers:
        return (
            f"stored layer {i} (labelled the last layer's pre-norm output) holds the final norm's output, "
            "POST-norm (transformers' hidden_states[-1])"
        )
    if abs(j - i) == 1:
        entering = f"; it is the state entering layer {i}, which vLLM's input numbering calls {i}" if j == i - 1 else ""
        return f"stored layer {i} holds the output of layer {j}, not of {i}: OFF BY ONE{entering}"
    return f"stored layer {i} holds the {point(j, n_layers)}: shifted by {j - i:+d}"


def rel_matrix(
    a: VariantReader, b: VariantReader, keys: list[str], threads: int | None, device: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """rel-L2 and mean cosine ``[|A layers|, |B layers|]`` over ``keys``, and the tokens compared."""
    la, lb = a.record.all_layers, b.record.all_layers
    pairs = [(i, j) for i in range(len(la)) for j in range(len(lb))]
    hidden = a.record.hidden_size
    workspaces = ThreadLocal(lambda: Workspace(device, compiled=False))  # (sums only: no count or max)

    def reduce(key: str, states: list[list[torch.Tensor]]) -> np.ndarray:
        sa, sb = states
        ts = token_sums([sa[i] for i, _ in pairs], [sb[j] for _, j in pairs], workspaces.get())
        return summarize(key, ts, hidden).sums

    total = np.zeros((len(pairs), len(C)))
    for sums in map_samples([a, b], keys, [la, lb], reduce, threads=threads):
        total += sums
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.sqrt(total[:, C["sq_diff"]] / total[:, C["sq_ref"]]).reshape(len(la), len(lb))
        cos = (1.0 - total[:, C["cos1m_sum"]] / total[:, C["tokens"]]).reshape(len(la), len(lb))
    return rel, cos, int(total[0, C["tokens"]]) if pairs else 0


def align(
    a: VariantReader,
    b: VariantReader,
    keys: list[str],
    a_target: str,
    b_target: str,
    samples: int | None = DEFAULT_SAMPLES,
    seed: int = 0,
    threads: int | None = None,
    device: str = "cpu",
) -> AlignReport:
    """Match each of A's layers against B's layers and capture points on shared samples."""
    if not capture_known(b):
        raise BadInput(
            f"B ({b.id}) has no known capture point (recipe.capture = "
            f"{or_none(b.record.prov.recipe.capture)!r}); --align matches A against a native "
            "variant: pass one built by hsstore as B"
        )
    if a.record.hidden_size != b.record.hidden_size:
        raise BadInput(
            f"hidden sizes differ: {a.record.hidden_size} (A) vs {b.record.hidden_size} (B): these are "
            "states of different models"
        )
    n_layers = num_layers(b)
    n = sample_count(len(keys), samples, None)
    chosen = [keys[int(i)] for i in choose([a.refs[k].length for k in keys], keys, n, seed).indices]
    rel, cos, tokens = rel_matrix(a, b, chosen, threads, device)
    la, lb = a.record.all_layers, b.record.all_layers
    layers = [_layer(i, la[i], lb, rel[i], cos[i], n_layers) for i in range(len(la))]
    wrong = [L for L in layers if L.relation != "as_labelled"]
    summary = summarize_layers(layers)
    return AlignReport(
        a=f"{a.store.location}#{a.id}",
        b=f"{b.store.location}#{b.id}",
        a_target=a_target,
        b_target=b_target,
        a_capture=str(or_none(a.record.prov.recipe.capture)),
        samples=len(chosen),
        tokens=tokens,
        b_layers=lb,
        b_points={str(j): point(j, n_layers) for j in lb},
        layers=layers,
        summary=summary,
        ok=not wrong,
    )


SHORT = {
    "off_by_one": "OFF BY ONE (A's layer i holds the output of i-1: the input convention; import with --capture input)",
    "pre_norm": "PRE-norm where post-final-norm is labelled",
    "post_norm": "POST-norm where the last layer's pre-norm output is labelled",
    "no_match": "match no layer of B",
}


def summarize_layers(layers: list[AlignLayer]) -> str:
    """One line: every mismatch kind with the A layers it concerns."""
    if all(L.relation == "as_labelled" for L in layers):
        return "every layer of A is what its label says"
    parts = []
    for kind, words in SHORT.items():
        ids = [L.layer for L in layers if L.relation == kind]
        if ids:
            parts.append(f"A's layer{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}: {words}")
    parts += [f"A's layer {L.layer} is B's layer {L.match}" for L in layers if L.relation == "shifted"]
    return "; ".join(parts)


def _layer(row: int, label: int, lb: list[int], rel: np.ndarray, cos: np.ndarray, n_layers: int) -> AlignLayer:
    order = np.argsort(np.where(np.isfinite(rel), rel, np.inf), kind="stable")
    best = int(order[0])
    runner = int(order[1]) if len(order) > 1 else None
    best_rel = float(rel[best])
    runner_rel = float(rel[runner]) if runner is not None else math.inf
    clear = best_rel <= MATCH_REL and (best_rel == 0.0 or runner_rel >= MARGIN * best_rel)
    if clear:
        kind, words = relation(label, lb[best], n_layers)
    else:
        kind = "no_match"
        words = (
            f"A's layer {label} matches no layer of B clearly (best B's layer {lb[best]} at rel-L2 {best_rel:.3g}, "
            f"next {runner_rel:.3g}): other model, other inputs, or a capture point B does not store"
        )
    return AlignLayer(
        layer=label,
        match=lb[best],
        rel_l2=best_rel,
        cos_mean=float(cos[best]),
        runner_up=lb[runner] if runner is not None else None,
        runner_up_rel_l2=runner_rel,
        relation=kind,
        message=words,
        rel_l2_by_b_layer={str(j): float(r) for j, r in zip(lb, rel)},
    )


def run_align(
    a_t: str,
    b_t: str,
    samples: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    device: str = "cpu",
    allow_different_models: bool = False,
    auto: bool = False,
) -> AlignReport:
    """``hsstore diff A B --align`` (``auto``: run because A's capture point is unknown)."""
    from hsstore.compare.diff import check_device, check_same_model, open_target, shared_keys
    from hsstore.compare.sampling import check_sampling

    check_sampling(samples, fraction, 0.95)
    device = check_device(device)
    a, b = open_target(a_t), open_target(b_t)
    notes = check_same_model(a, b, ("A", "B"), allow_different_models)
    keys = shared_keys(a, b)
    n = sample_count(len(keys), samples, fraction) if (samples or fraction) else DEFAULT_SAMPLES
    report = align(a, b, keys, a_t, b_t, n, seed, threads, device)
    if auto:
        notes.insert(
            0,
            f"A's capture point is {report.a_capture!r} (recipe.capture): its layers were matched against "
            "B's capture points instead of compared with B's same-numbered layers",
        )
    return report.replace(notes=notes)


def should_align(a: str | VariantReader) -> bool:
    """True when A (a target, or its reader already opened) records its capture point as unknown (a cache
    imported with --capture unknown)."""
    from hsstore.compare.diff import open_target

    reader = open_target(a) if isinstance(a, str) else a
    return reader.record.prov.recipe.capture == "unknown"

"""``hsstore diff``: join two variants on sample keys and stream per-layer divergence, optionally
against a precision floor (a third variant, typically fp32 of the same recipe)."""

from __future__ import annotations

import heapq
from typing import Any

import torch

from hsstore.compare.divergence import LayerDivergence, verdict
from hsstore.core.dtypes import UNIT_ROUNDOFF
from hsstore.core.errors import BadInput
from hsstore.storage.store import Store, VariantReader, split_target

NOISE_FACTOR = 2.0  # a divergence up to this multiple of the floor is precision noise


def open_target(target: str) -> VariantReader:
    path, selector = split_target(target)
    store = Store.open(path)
    reader = store.reader(store.select(selector))
    reader.check_corrupt_commits()
    return reader


def _layers(a: VariantReader, b: VariantReader, layers: list[int] | None) -> list[int]:
    la, lb = a.record.all_layers, b.record.all_layers
    if a.record.hidden_size != b.record.hidden_size:
        raise BadInput(f"hidden sizes differ: {a.record.hidden_size} (A {a.id}) vs {b.record.hidden_size} (B {b.id}); "
                       "these are states of different models")
    if layers:
        missing = [i for i in layers if i not in la or i not in lb]
        if missing:
            raise BadInput(f"layer(s) {missing} are not stored in both variants (A: {la}, B: {lb})")
        return sorted(layers)
    if la != lb:
        raise BadInput(f"layer sets differ: A {a.id} stores {la}, B {b.id} stores {lb}; pass --layers with shared ones")
    return la


def compare(a: VariantReader, b: VariantReader, layers: list[int], loss_only: bool = False,
            worst: int = 10, device: str = "cpu") -> dict[str, Any]:
    """Per-layer divergence of A against B (the reference) over every shared sample."""
    shared = [k for k in a.keys if k in b.refs]
    if not shared:
        raise BadInput(f"variants {a.id} and {b.id} share no samples (A has {len(a.keys)}, B {len(b.keys)}); "
                       "were they built from the same inputs and tokenizer?")
    ulps = a.record.dtype == "bf16" and b.record.dtype == "bf16"
    acc = {i: LayerDivergence(ulps, device) for i in layers}
    heap: list[tuple[float, str]] = []
    tokens = 0
    for key in shared:
        ra, rb = a.refs[key], b.refs[key]
        sa, sb = a.read_layers(ra, layers), b.read_layers(rb, layers)
        if loss_only:
            _, mask = a.read_tokens(ra)
            sel = torch.from_numpy(mask.astype(bool))
            sa, sb = [t[sel] for t in sa], [t[sel] for t in sb]
        rel = 0.0
        for i, x, y in zip(layers, sa, sb):
            rel = acc[i].add(x, y)
        tokens += sa[0].shape[0]
        heapq.heappush(heap, (rel, key))
        if len(heap) > worst:
            heapq.heappop(heap)
    return {
        "shared_samples": len(shared),
        "only_a": sum(1 for k in a.keys if k not in b.refs),
        "only_b": sum(1 for k in b.keys if k not in a.refs),
        "tokens": tokens,
        "layers": [{"layer": i, **acc[i].result()} for i in layers],
        "worst_samples": [{"key": k, "rel_l2": r} for r, k in sorted(heap, reverse=True)],
    }


def diff_targets(a_t: str, b_t: str, floor_t: str | None = None, layers: list[int] | None = None,
                 loss_only: bool = False, noise_factor: float = NOISE_FACTOR, device: str = "cpu") -> dict[str, Any]:
    """The ``hsstore diff --json`` report."""
    a, b = open_target(a_t), open_target(b_t)
    use = _layers(a, b, layers)
    report: dict[str, Any] = {"a": f"{a.store.location}#{a.id}", "b": f"{b.store.location}#{b.id}",
                              "loss_only": loss_only, **compare(a, b, use, loss_only, device=device)}
    dtype = a.record.dtype
    identical = all(L["bit_exact"] == 1.0 for L in report["layers"])
    if floor_t:
        c = open_target(floor_t)
        _layers(a, c, use)
        fl = compare(a, c, use, loss_only, device=device)
        report["floor"] = f"{c.store.location}#{c.id}"
        report["floor_layers"] = fl["layers"]
        worst_ratio = 0.0
        for L, F in zip(report["layers"], fl["layers"]):
            L["floor_rel_l2"] = F["rel_l2"]
            ratio = L["rel_l2"] / F["rel_l2"] if F["rel_l2"] > 0 else (0.0 if L["rel_l2"] == 0 else float("inf"))
            L["floor_ratio"] = ratio
            L["verdict"] = "identical (bit-exact)" if L["bit_exact"] == 1.0 else verdict(ratio, dtype, noise_factor)
            worst_ratio = max(worst_ratio, ratio)
        worst = max(report["layers"], key=lambda L: L["floor_ratio"])
        overall = (f"A and B differ {'within' if worst_ratio <= noise_factor else 'beyond'} precision "
                   f"noise: worst layer {worst['layer']} at {worst_ratio:.2f}x the floor (noise up to {noise_factor:g}x)")
    else:
        u = UNIT_ROUNDOFF[dtype]
        for L in report["layers"]:
            L["roundoff_ratio"] = L["rel_l2"] / u
        worst = max(report["layers"], key=lambda L: L["rel_l2"])
        overall = (f"no floor given (pass --floor STORE#fp32-variant for a verdict); worst rel-L2 "
                   f"{worst['rel_l2']:.3g} at layer {worst['layer']} = {worst['roundoff_ratio']:.1f}x the {dtype} "
                   "unit roundoff")
    report["verdict"] = "identical: every shared value is bit-exact" if identical else overall
    return report

"""``hsstore diff``: join two variants on sample keys and stream per-layer divergence, optionally
against a precision floor (a third variant, typically fp32 of the same recipe).

One pass reads A, B (and the floor C) side by side on every core (``hsstore.compare.stream``); each
sample reduces to per-layer sums (``kernel``, ``divergence``) that are added in key order.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from hsstore.compare.divergence import SampleSums, Totals, layer_stats, summarize, verdict
from hsstore.compare.kernel import Workspace, token_sums
from hsstore.compare.stream import ThreadLocal, map_samples
from hsstore.core.dtypes import UNIT_ROUNDOFF
from hsstore.core.errors import BadInput
from hsstore.core.schema.diff import DiffReport, LayerDiff, WorstSample
from hsstore.storage.store import Store, VariantReader, split_target

NOISE_FACTOR = 2.0  # a divergence up to this multiple of the floor is precision noise
WORST = 10  # samples listed in worst_samples


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` that exists here."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise BadInput(f"unknown device {device!r}; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"device {device!r} requested but no CUDA GPU is visible here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInput(f"device {device!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
    return str(dev)


def open_target(target: str) -> VariantReader:
    path, selector = split_target(target)
    store = Store.open(path)
    reader = store.reader(store.select(selector))
    reader.check_corrupt_commits()
    return reader


def check_layers(a: VariantReader, b: VariantReader, layers: list[int] | None) -> list[int]:
    """The layers to compare: ``layers`` if both store them, else all (which must be the same)."""
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


def shared_keys(a: VariantReader, b: VariantReader) -> list[str]:
    """Keys committed in both, in A's order (chunk-local reads)."""
    shared = [k for k in a.keys if k in b.refs]
    if not shared:
        raise BadInput(f"variants {a.id} and {b.id} share no samples (A has {len(a.keys)}, B {len(b.keys)}); "
                       "were they built from the same inputs and tokenizer?")
    return shared


def both_bf16(a: VariantReader, b: VariantReader) -> bool:
    return a.record.dtype == "bf16" and b.record.dtype == "bf16"


def sample_sums(a: VariantReader, others: Sequence[VariantReader], keys: Sequence[str], layers: list[int],
                loss_only: bool = False, device: str = "cpu",
                threads: int | None = None) -> Iterator[tuple[SampleSums, ...]]:
    """For each key (in order): one SampleSums of A against each of ``others``."""
    hidden = a.record.hidden_size
    ulps = [both_bf16(a, o) for o in others]
    workspaces = ThreadLocal(lambda: Workspace(device))

    def reduce(key: str, states: list[torch.Tensor]) -> tuple[SampleSums, ...]:
        ws = workspaces.get()
        return tuple(summarize(key, token_sums(states[0], s, ws, u), hidden) for s, u in zip(states[1:], ulps))

    yield from map_samples([a, *others], keys, layers, reduce, loss_only, threads)


def layer_reports(layers: list[int], totals: Totals, ulps: bool) -> list[LayerDiff]:
    return [LayerDiff(layer=i, **layer_stats(totals.sums[j], totals.maxes[j], totals.hist[j], ulps))
            for j, i in enumerate(layers)]


def with_floor(layers: list[LayerDiff], floor: list[LayerDiff], dtype: str,
               noise_factor: float) -> tuple[list[LayerDiff], str, str]:
    """Layers with floor ratios and verdicts, the overall verdict and its kind."""
    out = []
    for L, F in zip(layers, floor):
        ratio = L.rel_l2 / F.rel_l2 if F.rel_l2 > 0 else (0.0 if L.rel_l2 == 0 else float("inf"))
        v = "identical (bit-exact)" if L.bit_exact == 1.0 else verdict(ratio, dtype, noise_factor)
        out.append(L.replace(floor_rel_l2=F.rel_l2, floor_ratio=ratio, verdict=v))
    worst = max(out, key=lambda L: L.floor_ratio)
    worst_ratio, worst_layer = max(0.0, worst.floor_ratio), worst.layer
    within = worst_ratio <= noise_factor
    text = (f"A and B differ {'within' if within else 'beyond'} precision noise: worst layer {worst_layer} at "
            f"{worst_ratio:.2f}x the floor (noise up to {noise_factor:g}x)")
    return out, text, "within_noise" if within else "beyond_noise"


def without_floor(layers: list[LayerDiff], dtype: str) -> tuple[list[LayerDiff], str]:
    u = UNIT_ROUNDOFF.get(dtype)
    out = [L.replace(roundoff_ratio=L.rel_l2 / u) if u else L for L in layers]
    worst = max(out, key=lambda L: L.rel_l2)
    scale = f" = {worst.roundoff_ratio:.1f}x the {dtype} unit roundoff" if u else ""
    return out, (f"no floor given (pass --floor STORE#fp32-variant for a verdict); worst rel-L2 "
                 f"{worst.rel_l2:.3g} at layer {worst.layer}{scale}")


def run_diff(a_t: str, b_t: str, floor_t: str | None = None, layers: list[int] | None = None,
             loss_only: bool = False, noise_factor: float = NOISE_FACTOR, device: str = "cpu",
             threads: int | None = None) -> DiffReport:
    """Per-layer divergence of A against B over every shared sample (and of A against the floor)."""
    t0 = time.perf_counter()
    device = check_device(device)
    a, b = open_target(a_t), open_target(b_t)
    use = check_layers(a, b, layers)
    keys = shared_keys(a, b)
    c = open_target(floor_t) if floor_t else None
    others = [b]
    if c is not None:
        check_layers(a, c, use)
        others.append(c)
        floor_keys = shared_keys(a, c)
        if floor_keys != keys:  # other samples: the floor gets its own pass
            others.pop()
    totals = [Totals(len(use)) for _ in others]
    heap: list[tuple[float, str]] = []
    tokens = 0
    for sums in sample_sums(a, others, keys, use, loss_only, device, threads):
        for t, s in zip(totals, sums):
            t.add(s)
        tokens += int(sums[0].sums[0, 0]) if len(use) else 0
        heapq.heappush(heap, (sums[0].rel_l2(), sums[0].key))
        if len(heap) > WORST:
            heapq.heappop(heap)
    reps = layer_reports(use, totals[0], both_bf16(a, b))
    report: dict[str, Any] = {
        "a": f"{a.store.location}#{a.id}", "b": f"{b.store.location}#{b.id}", "a_target": a_t, "b_target": b_t,
        "shared_samples": len(keys), "only_a": sum(1 for k in a.keys if k not in b.refs),
        "only_b": sum(1 for k in b.keys if k not in a.refs), "tokens": tokens, "loss_only": loss_only,
        "worst_samples": [WorstSample(key=k, rel_l2=r) for r, k in sorted(heap, reverse=True)],
    }
    dtype = a.record.dtype
    if c is not None:
        if len(totals) > 1:
            floor = layer_reports(use, totals[1], both_bf16(a, c))
        else:
            floor = _floor_pass(a, c, use, loss_only, device, threads)
        reps, text, kind = with_floor(reps, floor, dtype, noise_factor)
        report.update(floor=f"{c.store.location}#{c.id}", floor_target=floor_t, floor_layers=floor)
    else:
        reps, text = without_floor(reps, dtype)
        kind = "no_floor"
    if all(L.bit_exact == 1.0 for L in reps):
        text, kind = "identical: every shared value is bit-exact", "identical"
    return DiffReport(layers=reps, verdict=text, verdict_kind=kind, seconds=time.perf_counter() - t0, **report)


def _floor_pass(a: VariantReader, c: VariantReader, layers: list[int], loss_only: bool, device: str,
                threads: int | None) -> list[LayerDiff]:
    totals = Totals(len(layers))
    for (s,) in sample_sums(a, [c], shared_keys(a, c), layers, loss_only, device, threads):
        totals.add(s)
    return layer_reports(layers, totals, both_bf16(a, c))


def diff_targets(a_t: str, b_t: str, floor_t: str | None = None, layers: list[int] | None = None,
                 loss_only: bool = False, noise_factor: float = NOISE_FACTOR, device: str = "cpu",
                 threads: int | None = None) -> dict[str, Any]:
    """The ``hsstore diff --json`` report as a plain dict."""
    return run_diff(a_t, b_t, floor_t, layers, loss_only, noise_factor, device, threads).to_dict()

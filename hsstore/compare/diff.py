"""``hsstore diff``: join two variants on sample keys and stream per-layer divergence, optionally
against a precision floor (a third variant, typically fp32 of the same recipe).

One pass reads A, B (and the floor C) side by side on every core (``hsstore.compare.stream``); each
sample reduces to per-layer sums (``kernel``, ``divergence``) that are added in key order.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from collections.abc import Iterator, Sequence

import torch

from hsstore.compare.divergence import SampleSums, Totals, summarize
from hsstore.compare.explain import check_floor, check_same_model, provenance_differences, same_variant
from hsstore.compare.estimate import Estimate, full_layers, sampled_layers, with_floor, without_floor
from hsstore.compare.kernel import Workspace, token_sums
from hsstore.compare.sampling import SampleTable
from hsstore.compare.sample_plan import SamplePlan, plan_samples
from hsstore.compare.stream import ThreadLocal, map_samples
from hsstore.core.errors import BadInput
from hsstore.core.schema.diff_report import DiffReport, LayerDiff, WorstSample
from hsstore.core.schema.record import UNSET
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

    def reduce(key: str, states: list[list[torch.Tensor]]) -> tuple[SampleSums, ...]:
        ws = workspaces.get()
        return tuple(summarize(key, token_sums(states[0], s, ws, u), hidden) for s, u in zip(states[1:], ulps))

    yield from map_samples([a, *others], keys, layers, reduce, loss_only, threads)


@dataclass
class PassResult:
    """One streaming pass: A against each of the others (full sums, or the sampled table)."""

    totals: list[Totals]
    tables: list[SampleTable]
    worst: list[WorstSample]
    tokens: int


def stream_pass(a: VariantReader, others: list[VariantReader], keys: Sequence[str], layers: list[int],
                loss_only: bool, device: str, threads: int | None, keep: bool) -> PassResult:
    """Stream ``keys``; ``keep`` the per-sample sums (a sampled diff) instead of only adding them up."""
    res = PassResult([Totals(len(layers)) for _ in others], [SampleTable() for _ in others] if keep else [], [], 0)
    heap: list[tuple[float, str]] = []
    for sums in sample_sums(a, others, keys, layers, loss_only, device, threads):
        for j, s in enumerate(sums):
            res.totals[j].add(s)
            if keep:
                res.tables[j].add(s)
        res.tokens += int(sums[0].sums[0, 0]) if layers else 0
        heapq.heappush(heap, (sums[0].rel_l2(), sums[0].key))
        if len(heap) > WORST:
            heapq.heappop(heap)
    res.worst = [WorstSample(key=k, rel_l2=r) for r, k in sorted(heap, reverse=True)]
    return res


@dataclass
class Targets:
    """A, B (and the floor C) opened and checked: the layers and samples they share, and what the
    report must say about them."""

    a: VariantReader
    b: VariantReader
    c: VariantReader | None
    layers: list[int]
    keys: list[str]
    notes: list[str]


def open_targets(a_t: str, b_t: str, floor_t: str | None, layers: list[int] | None,
                 allow_different_models: bool = False, a_reader: VariantReader | None = None) -> Targets:
    """Open and check: refuses a floor that is A or B and (unless allowed) states of different models.
    ``a_reader``: A already opened from ``a_t`` (the CLI opens it once, to ask whether to align)."""
    a, b = a_reader or open_target(a_t), open_target(b_t)
    notes = check_same_model(a, b, ("A", "B"), allow_different_models)
    if same_variant(a, b):  # every layer reads "bit-exact" by construction: say so, it is not a finding
        notes.append(f"A and B are one variant ({a.id} of {a.store.location}): the diff compares its states with "
                     "themselves, so 'identical' is by construction (a self-test of diff, not a comparison)")
    c = open_target(floor_t) if floor_t else None
    if c is not None:
        check_floor(a, b, c, floor_t)
        notes += check_same_model(a, c, ("A", "the floor C"), allow_different_models)
    use = check_layers(a, b, layers)
    if c is not None:
        check_layers(a, c, use)
    return Targets(a, b, c, use, shared_keys(a, b), notes)


def run_diff(a_t: str, b_t: str, floor_t: str | None = None, layers: list[int] | None = None,
             loss_only: bool = False, noise_factor: float = NOISE_FACTOR, device: str = "cpu",
             threads: int | None = None, samples: int | None = None, fraction: float | None = None,
             seed: int = 0, confidence: float = 0.95, allow_different_models: bool = False,
             a_reader: VariantReader | None = None) -> DiffReport:
    """Per-layer divergence of A against B (and of A against the floor C) over every shared sample,
    or over a seeded length-stratified choice of them (``samples`` / ``fraction``) with intervals.
    ``a_reader``: A already opened from ``a_t`` (not opened again)."""
    t0 = time.perf_counter()
    device = check_device(device)
    t = open_targets(a_t, b_t, floor_t, layers, allow_different_models, a_reader)
    a, b, c, use, keys = t.a, t.b, t.c, t.layers, t.keys
    plan = plan_samples(a, b, c, keys, samples, fraction, seed, confidence)
    others = [b] if c is None or (plan is None and shared_keys(a, c) != keys) else [b, c]
    res = stream_pass(a, others, plan.keys if plan else keys, use, loss_only, device, threads, plan is not None)
    ests = [estimate(use, res, j, plan, both_bf16(a, o)) for j, o in enumerate(others)]
    floor = None
    if c is not None:
        floor = ests[1] if len(ests) > 1 else _floor_pass(a, c, use, loss_only, device, threads)
        reps, text, kind = with_floor(ests[0], floor, a.record.dtype, noise_factor, confidence)
    else:
        (reps, text), kind = without_floor(ests[0], a.record.dtype), "no_floor"
    text, kind = _verdict(reps, text, kind, plan, t.notes)
    return DiffReport(
        a=f"{a.store.location}#{a.id}", b=f"{b.store.location}#{b.id}", a_target=a_t, b_target=b_t,
        shared_samples=len(keys), only_a=sum(1 for k in a.keys if k not in b.refs),
        only_b=sum(1 for k in b.keys if k not in a.refs), tokens=res.tokens, loss_only=loss_only, layers=reps,
        worst_samples=res.worst, notes=t.notes, verdict=text, verdict_kind=kind,
        provenance_differences=provenance_differences(a.record.provenance, b.record.provenance,
                                                      c.record.provenance if c is not None else None),
        sampling=plan.record if plan is not None else UNSET,
        floor=f"{c.store.location}#{c.id}" if c is not None else UNSET, floor_target=floor_t if c is not None else UNSET,
        floor_layers=floor.layers if floor is not None else UNSET, seconds=time.perf_counter() - t0,
    )


def _verdict(layers: list[LayerDiff], text: str, kind: str, plan: SamplePlan | None,
             notes: list[str]) -> tuple[str, str]:
    """The verdict in words and its kind: bit-exact layers are "identical", whatever the floor says; states
    of different models say so first."""
    if all(L.bit_exact == 1.0 for L in layers):
        text, kind = "identical: every shared value is bit-exact", "identical"
        if plan is not None:
            text = f"identical: every value of the {len(plan.keys)} sampled samples is bit-exact"
    if any("different model" in n or "different tokenizer" in n for n in notes):
        text = "A and B are states of DIFFERENT MODELS (--allow-different-models); " + text
    return text, kind


def estimate(layers: list[int], res: PassResult, j: int, plan: SamplePlan | None, ulps: bool) -> Estimate:
    if plan is None:
        return full_layers(layers, res.totals[j], ulps)
    return sampled_layers(layers, res.tables[j], plan.choice, ulps, plan.record.confidence, plan.record.seed)


def _floor_pass(a: VariantReader, c: VariantReader, layers: list[int], loss_only: bool, device: str,
                threads: int | None) -> Estimate:
    res = stream_pass(a, [c], shared_keys(a, c), layers, loss_only, device, threads, keep=False)
    return full_layers(layers, res.totals[0], both_bf16(a, c))

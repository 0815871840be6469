"""``hsstore diff``: join two variants on sample keys and stream per-layer divergence, optionally
against a precision floor (a third variant, typically fp32 of the same recipe).

One pass reads A, B (and the floor C) side by side on every core (``hsstore.compare.diff``); each
sample reduces to per-layer sums (``kernel``) that are added in key order.
"""

from __future__ import annotations

import heapq
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch

from hsstore.compare.kernel import SampleSums, Totals, Workspace, compiled_kernel, summarize, token_sums
from hsstore.compare.sampling import (
    Estimate,
    SamplePlan,
    SampleTable,
    coarser,
    full_layers,
    plan_samples,
    sampled_layers,
    upper_bound,
    with_floor,
    without_floor,
)
from hsstore.core.batching import memory_budget
from hsstore.core.dtypes import STORED, UNIT_ROUNDOFF
from hsstore.core.errors import BadInput
from hsstore.core.provenance_match import flatten, is_informational
from hsstore.core.schema.record import UNSET, Record
from hsstore.core.schema.reports import DiffReport, DiffVerdictKind, FieldDifference, LayerDiff, WorstSample
from hsstore.storage.reader import VariantReader
from hsstore.storage.store import Store, split_target

# --- What a diff is asked: the two variants and the floor, which layers, samples and tokens, and where

NOISE_FACTOR = 2.0  # a divergence up to this multiple of the floor is precision noise


class DiffRequest(Record):
    """A diff of ``a_target`` against ``b_target`` (STORE#SELECTOR each), judged against ``floor`` (STORE#SELECTOR
    of a precision floor, e.g. fp32; None: no floor) with ``noise_factor``: the ``layers`` both store (None: all),
    over every shared sample or a seeded (``seed``), length-stratified choice of ``samples`` (or a ``fraction``)
    with ``confidence`` intervals, loss-masked tokens only when ``loss_only``; the arithmetic on ``device`` with
    ``threads`` worker threads (None: every core). States of different models or tokenizers are refused unless
    ``allow_different_models``."""

    a_target: str
    b_target: str
    floor: str | None = None
    layers: list[int] | None = None
    loss_only: bool = False
    noise_factor: float = NOISE_FACTOR
    device: str = "cpu"
    threads: int | None = None
    samples: int | None = None
    fraction: float | None = None
    seed: int = 0
    confidence: float = 0.95
    allow_different_models: bool = False


# --- Stream the shared samples of two variants through reading and arithmetic on every core, in order,

R = TypeVar("R")
BYTES_PER_THREAD = 256 << 20  # states in flight per worker thread


def cpu_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_TORCH_THREADS_LOCK = threading.Lock()


@contextmanager
def torch_single_threaded() -> Iterator[None]:
    """torch intra-op parallelism off for the duration (restored after)."""
    with _TORCH_THREADS_LOCK:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sample_bytes(readers: Sequence[VariantReader], length: int, layers: Sequence[list[int]]) -> int:
    per_token = sum(STORED.get(r.record.dtype, STORED["fp32"]).itemsize * len(ls) for r, ls in zip(readers, layers))
    return length * readers[0].record.hidden_size * (per_token + 16)  # + float32 block work


def map_samples(
    readers: Sequence[VariantReader],
    keys: Sequence[str],
    layers: list[int] | list[list[int]],
    fn: Callable[[str, list[list[torch.Tensor]]], R],
    loss_only: bool = False,
    threads: int | None = None,
    budget_bytes: int | None = None,
) -> Iterator[R]:
    """``fn(key, [[states [T, H] of each layer] of each reader])`` for every key, in order; T counts the
    first reader's loss-masked tokens only when ``loss_only``. Reading and ``fn`` run on worker threads,
    with BYTES_PER_THREAD of states in flight per thread, at most the command's memory budget in all;
    each reading its sample's layers one after the other (no nested pools: one thread per core).
    ``layers``: the same layer ids for every reader, or one list per reader."""
    # (the isinstance narrows the nested case; mypy does not narrow the other to list[int]: the cast says so)
    per_reader = layers if layers and isinstance(layers[0], list) else [cast("list[int]", layers)] * len(readers)
    threads = threads or cpu_threads()
    budget = budget_bytes or min(BYTES_PER_THREAD * threads, memory_budget())  # never more than the machine's
    window = 2 * threads

    def task(key: str) -> R:
        states = [r.read_layers(r.refs[key], ls) for r, ls in zip(readers, per_reader)]
        if loss_only:
            _, mask = readers[0].read_tokens(readers[0].refs[key])
            sel = torch.from_numpy(mask.astype(np.bool_))
            states = [[t[sel] for t in per_layer] for per_layer in states]
        return fn(key, states)

    pending: deque[tuple[Future[R], int]] = deque()
    in_flight = 0
    with torch_single_threaded(), ThreadPoolExecutor(threads, thread_name_prefix="hsstore-diff") as pool:
        try:
            for key in keys:
                size = _sample_bytes(readers, readers[0].refs[key].length, per_reader)
                while pending and (len(pending) >= window or in_flight + size > budget):
                    fut, n = pending.popleft()
                    in_flight -= n
                    yield fut.result()
                pending.append((pool.submit(task, key), size))
                in_flight += size
            while pending:
                yield pending.popleft()[0].result()
        finally:
            for fut, _ in pending:
                fut.cancel()


class ThreadLocal:
    """One object per worker thread, made on first use (e.g. a kernel Workspace)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._local = threading.local()

    def get(self) -> Any:
        obj = getattr(self._local, "obj", None)
        if obj is None:
            obj = self._local.obj = self._make()
        return obj


# --- A diff that explains itself: what differs in the provenance of A, B (and the floor C), and the

ABSENT = "<absent>"
# fingerprints that say whose states these are; a different one means another model or tokenizer
IDENTITY = (("recipe.model.fingerprint", "model"), ("recipe.tokenizer.fingerprint", "tokenizer"))
UNKNOWN = (None, "", "unknown")


def store_identity(location: str) -> str:
    """One spelling per store: local paths resolved (``./s.zarr``, ``s.zarr/`` and symlinks alike),
    URLs without a trailing slash."""
    if "://" in location and not location.startswith("file://"):
        return location.rstrip("/")
    return os.path.realpath(location.removeprefix("file://"))


def same_variant(x: VariantReader, y: VariantReader) -> bool:
    return x.id == y.id and store_identity(x.store.location) == store_identity(y.store.location)


def check_floor(a: VariantReader, b: VariantReader, c: VariantReader, floor_target: str) -> None:
    """Refuse a floor that is A or B (its divergence from A would be 0, or B's own: every layer would read
    "within precision noise" by construction), and A or C stored at a reduced precision (A against C would
    then measure storage error, not precision noise)."""
    for name, x in (("A", a), ("B", b)):
        if same_variant(c, x):
            raise BadInput(
                f"the floor {floor_target!r} is {name} itself (variant {c.id} of {c.store.location}); a floor "
                "must be a third variant whose divergence from A is pure precision (A's recipe in fp32 "
                "when B is another kernel or device); to measure bf16 against fp32 itself, diff them "
                "without --floor"
            )
        if c.id == x.id:  # a variant id names its provenance: a copy of the store, or the same build again
            raise BadInput(
                f"the floor {floor_target!r} is the same computation as {name} (variant {c.id}, in "
                f"{c.store.location} and {x.store.location}): its divergence from A would be {name}'s own; a floor "
                "must be A's recipe in a finer dtype"
            )
    for name, x in (("A", a), ("the floor C", c)):
        stored = x.record.stored_precision
        if stored:
            raise BadInput(
                f"{name} ({floor_target if x is c else 'variant ' + x.id}) is stored as {stored}: A against "
                f"the floor would measure {stored} storage error, not precision noise, and hide "
                "divergences up to that size; make A and C variants stored as computed (e.g. diff the "
                f"{stored} variant as B against its source as A), or diff without --floor"
            )


def _fingerprint(r: VariantReader, field: str) -> Any:
    return flatten(r.record.provenance).get(field)


def check_same_model(x: VariantReader, y: VariantReader, names: tuple[str, str], allow: bool) -> list[str]:
    """Refuse (unless ``allow``) two variants whose model or tokenizer fingerprints differ; returns
    notes for the report (what differs when allowed, what could not be checked)."""
    notes = []
    for field, what in IDENTITY:
        fx, fy = _fingerprint(x, field), _fingerprint(y, field)
        if fx in UNKNOWN or fy in UNKNOWN:
            notes.append(
                f"{what} identity of {names[0] if fx in UNKNOWN else names[1]} is not recorded: "
                f"not checked that {names[0]} and {names[1]} come from the same {what}"
            )
            continue
        if fx == fy:
            continue
        model = {v: flatten(v.record.provenance).get("recipe.model.name", "?") for v in (x, y)}
        if not allow:
            raise BadInput(
                f"{names[0]} and {names[1]} are states of different {what}s: {field} {fx!r} "
                f"({model[x]}) != {fy!r} ({model[y]}); their divergence says nothing about precision. "
                "Pass --allow-different-models to compare them anyway"
            )
        notes.append(
            f"{names[0]} and {names[1]} are states of different {what}s ({field} {fx} != {fy}); "
            "compared because --allow-different-models was given"
        )
    return notes


def provenance_differences(
    a: Mapping[str, Any], b: Mapping[str, Any], c: Mapping[str, Any] | None = None
) -> list[FieldDifference]:
    """Every provenance field whose value is not the same in A, B (and C), numeric fields first."""
    flats = [flatten(p) for p in (a, b, c) if p is not None]
    fields = sorted(set().union(*flats))
    out = []
    for field in fields:
        values = [f.get(field, ABSENT) for f in flats]
        if all(v == values[0] for v in values[1:]):
            continue
        extra = {"c": values[2]} if c is not None else {}
        out.append(
            FieldDifference(field=field, a=values[0], b=values[1], informational=is_informational(field), **extra)
        )
    return sorted(out, key=lambda d: (d.informational, d.field))


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
        raise BadInput(
            f"hidden sizes differ: {a.record.hidden_size} (A {a.id}) vs {b.record.hidden_size} (B {b.id}); "
            "these are states of different models"
        )
    if layers:
        missing = [i for i in layers if i not in la or i not in lb]
        if missing:
            raise BadInput(f"layer(s) {missing} are not stored in both variants (A: {la}, B: {lb})")
        return sorted(set(layers))
    if la != lb:
        raise BadInput(f"layer sets differ: A {a.id} stores {la}, B {b.id} stores {lb}; pass --layers with shared ones")
    return la


def shared_keys(a: VariantReader, b: VariantReader) -> list[str]:
    """Keys committed in both, in A's order (chunk-local reads)."""
    shared = [k for k in a.keys if k in b.refs]
    if not shared:
        raise BadInput(
            f"variants {a.id} and {b.id} share no samples (A has {len(a.keys)}, B {len(b.keys)}); "
            "were they built from the same inputs and tokenizer?"
        )
    return shared


def both_bf16(a: VariantReader, b: VariantReader) -> bool:
    return a.record.dtype == "bf16" and b.record.dtype == "bf16"


# The C loops (compare/kernel.c) load from their cache in ~1 ms (a host's first diff builds them once, ~0.3 CPU-s of
# the compiler's, on a thread while the first samples are read); their fused pass a row then saves ~0.5-1 ns a value
# pair against torch's ops (scripts/bench_ulp.py). A diff takes them where its pairs pay the load back many times
# over. The choice depends on the data alone (not on --threads): the same diff gives the same numbers however run.
COMPILED_MIN_VALUES = 1 << 22  # value pairs to compare, bf16-vs-bf16 pairs counted twice (~4 ms of work saved)


def use_compiled(a: VariantReader, keys: Sequence[str], layers: Sequence[int], ulps: Sequence[bool] = (False,)) -> bool:
    """Whether comparing ``layers`` of ``keys`` against one variant per ``ulps`` entry (True: both bf16, the ULP
    buckets too) is enough work to pay for loading the compiled loops."""
    per_token = a.record.hidden_size * len(layers) * sum(1 + bool(u) for u in ulps)
    tokens = 0
    for key in keys if per_token else ():
        tokens += a.refs[key].length
        if tokens * per_token >= COMPILED_MIN_VALUES:
            return True
    return False


def sample_sums(
    a: VariantReader,
    others: Sequence[VariantReader],
    keys: Sequence[str],
    layers: list[int],
    request: DiffRequest,
    compiled: bool | None = None,
) -> Iterator[tuple[SampleSums, ...]]:
    """For each key (in order): one SampleSums of A against each of ``others`` (``request``'s loss_only, device
    and threads). ``compiled``: whether the C loops serve (default: as ``use_compiled`` says for these keys)."""
    hidden = a.record.hidden_size
    ulps = [both_bf16(a, o) for o in others]
    if compiled is None:
        compiled = use_compiled(a, keys, layers, ulps)
    compiled = compiled and torch.device(request.device).type == "cpu"
    if compiled:  # loaded (built, the first time on this host) on a thread of its own while the first samples are read
        threading.Thread(target=compiled_kernel, name="hsstore-diff-loops", daemon=True).start()
    workspaces = ThreadLocal(lambda: Workspace(request.device, compiled))

    def reduce(key: str, states: list[list[torch.Tensor]]) -> tuple[SampleSums, ...]:
        ws = workspaces.get()
        return tuple(summarize(key, token_sums(states[0], s, ws, u), hidden, ws) for s, u in zip(states[1:], ulps))

    yield from map_samples([a, *others], keys, layers, reduce, request.loss_only, request.threads)


@dataclass
class PassResult:
    """One streaming pass: A against each of the others (full sums, or the sampled table)."""

    totals: list[Totals]
    tables: list[SampleTable]
    worst: list[WorstSample]
    tokens: int


def stream_pass(
    a: VariantReader,
    others: list[VariantReader],
    keys: Sequence[str],
    layers: list[int],
    request: DiffRequest,
    keep: bool,
    compiled: bool | None = None,
) -> PassResult:
    """Stream ``keys``; ``keep`` the per-sample sums (a sampled diff) instead of only adding them up; ``compiled``:
    as ``sample_sums``."""
    res = PassResult([Totals(len(layers)) for _ in others], [SampleTable() for _ in others] if keep else [], [], 0)
    heap: list[tuple[float, str]] = []
    for sums in sample_sums(a, others, keys, layers, request, compiled):
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


def open_targets(request: DiffRequest, a_reader: VariantReader | None = None) -> Targets:
    """Open and check ``request``'s targets: refuses a floor that is A or B and (unless allowed) states of
    different models. ``a_reader``: A already opened from ``request.a_target`` (the CLI opens it once, to ask
    whether to align)."""
    floor_t, allow_different_models = request.floor, request.allow_different_models
    a, b = a_reader or open_target(request.a_target), open_target(request.b_target)
    notes = check_same_model(a, b, ("A", "B"), allow_different_models)
    if same_variant(a, b):  # every layer reads "bit-exact" by construction: say so, it is not a finding
        notes.append(
            f"A and B are one variant ({a.id} of {a.store.location}): the diff compares its states with "
            "themselves, so 'identical' is by construction (a self-test of diff, not a comparison)"
        )
    c = open_target(floor_t) if floor_t else None
    if c is not None and floor_t:
        check_floor(a, b, c, floor_t)
        notes += check_same_model(a, c, ("A", "the floor C"), allow_different_models)
    use = check_layers(a, b, request.layers)
    if c is not None:
        check_layers(a, c, use)
    return Targets(a, b, c, use, shared_keys(a, b), notes)


def run_diff(request: DiffRequest, a_reader: VariantReader | None = None) -> DiffReport:
    """Per-layer divergence of A against B (and of A against the floor C) over every shared sample,
    or over a seeded length-stratified choice of them (``samples`` / ``fraction``) with intervals.
    ``a_reader``: A already opened from ``request.a_target`` (not opened again)."""
    t0 = time.perf_counter()
    request = request.replace(device=check_device(request.device))
    t = open_targets(request, a_reader)
    a, b, c, use, keys = t.a, t.b, t.c, t.layers, t.keys
    plan = plan_samples(a, b, c, keys, request.samples, request.fraction, request.seed, request.confidence)
    others = [b] if c is None or (plan is None and shared_keys(a, c) != keys) else [b, c]
    if len(others) == 1 and c is not None:  # (a sampled diff's plan says what the floor holds of its choice)
        t.notes.append(floor_samples_note(shared_keys(a, c), keys))
    # one choice of arithmetic for every pass, from A against B over every shared sample: a sampled diff (with or
    # without a floor) then computes each sample as the full diff does, and its one-sided bounds on max |d| and
    # min cos hold against it
    compiled = use_compiled(a, keys, use, [both_bf16(a, b)])
    res = stream_pass(a, others, plan.keys if plan else keys, use, request, plan is not None, compiled)
    if res.tokens == 0:  # every statistic would be 0 and read as agreement
        why = "every shared sample's loss mask is empty; drop --loss-only" if request.loss_only else "no sample has one"
        raise BadInput(f"no token to compare: {why}")
    ests = [estimate(use, res, j, plan, both_bf16(a, o)) for j, o in enumerate(others)]
    floor = None
    if c is not None:
        floor = ests[1] if len(ests) > 1 else _floor_pass(a, c, use, request, compiled)
    reps, text, kind = judge(t, ests[0], floor, request)
    text, kind = _verdict(reps, text, kind, plan, t.notes)
    return DiffReport(
        a=f"{a.store.location}#{a.id}",
        b=f"{b.store.location}#{b.id}",
        a_target=request.a_target,
        b_target=request.b_target,
        shared_samples=len(keys),
        only_a=sum(1 for k in a.keys if k not in b.refs),
        only_b=sum(1 for k in b.keys if k not in a.refs),
        tokens=res.tokens,
        loss_only=request.loss_only,
        layers=reps,
        worst_samples=res.worst,
        notes=t.notes,
        verdict=text,
        verdict_kind=kind,
        provenance_differences=provenance_differences(
            a.record.provenance, b.record.provenance, c.record.provenance if c is not None else None
        ),
        sampling=plan.record if plan is not None else UNSET,
        floor=f"{c.store.location}#{c.id}" if c is not None else UNSET,
        floor_target=request.floor if c is not None and request.floor else UNSET,
        floor_layers=floor.layers if floor is not None else UNSET,
        seconds=time.perf_counter() - t0,
    )


def floor_samples_note(floor_keys: Sequence[str], keys: Sequence[str]) -> str:
    """What a full diff's floor is measured over when C does not hold the samples A and B share."""
    return (
        f"the floor C is measured over the {len(floor_keys)} samples A and C share, {len(set(floor_keys) & set(keys))} "
        f"of the {len(keys)} A and B share: its rel-L2 is that of those samples"
    )


def judge(
    t: Targets, est: Estimate, floor: Estimate | None, request: DiffRequest
) -> tuple[list[LayerDiff], str, DiffVerdictKind]:
    """The layers with their verdicts, the verdict and its kind, against the floor's estimate (None: no floor); notes
    in ``t.notes`` the layers that hold non-finite values bit-exact on both sides."""
    a, b, c = t.a, t.b, t.c
    kind: DiffVerdictKind
    if c is not None and floor is not None:
        reps, text, kind = with_floor(est, floor, a.record.dtype, request.noise_factor, request.confidence)
        text, kind = floor_caveats(a, b, c, reps, text, kind)
    else:
        (reps, text), kind = without_floor(est, coarser(a.record.dtype, b.record.dtype)), "no_floor"
    t.notes.extend(
        f"layer {L.layer} holds NaN or infinite values, the same in A and B (bit-exact): identical, and unhealthy"
        for L in reps
        if L.bit_exact == 1.0 and not math.isfinite(L.rel_l2)
    )
    return reps, text, kind


def _verdict(
    layers: list[LayerDiff], text: str, kind: DiffVerdictKind, plan: SamplePlan | None, notes: list[str]
) -> tuple[str, DiffVerdictKind]:
    """The verdict in words and its kind: bit-exact layers are "identical", whatever the floor says; states
    of different models say so first."""
    if all(L.bit_exact == 1.0 for L in layers):
        text, kind = "identical: every shared value is bit-exact", "identical"
        if plan is not None:
            text = f"identical: every value of the {len(plan.keys)} sampled samples is bit-exact"
    if plan is not None and kind in ("identical", "within_noise") and len(plan.keys) < plan.record.population:
        text += "; " + unseen_share(len(plan.keys), plan.record.population, plan.record.confidence)
    if any("different model" in n or "different tokenizer" in n for n in notes):
        text = "A and B are states of DIFFERENT MODELS (--allow-different-models); " + text
    return text, kind


def unseen_share(n: int, population: int, confidence: float) -> str:
    """What ``n`` samples drawn from ``population`` cannot see: a divergence confined to a share of the samples below
    the one-sided upper bound after 0 of n (at ``confidence``), which the sample misses with odds of 1 - confidence."""
    share = upper_bound(0, n, confidence)
    return (
        f"a divergence confined to under {share:.0%} of the {population:,} samples goes unseen by {n} sampled at "
        f"{confidence:.0%} confidence: raise --samples (or drop it) to rule it out"
    )


# provenance fields that name how states were computed: a floor that differs from A in one holds that difference
COMPUTATION_FIELDS = ("environment.backend", "environment.kernels")
# a floor of another computation than A's, farther from A than this many of A's unit roundoffs, is more than A's
# rounding (a bf16 forward's own stays within a few: 0.8-1.4 per layer in `bash scripts/demo.sh`'s bf16-vs-fp32 diff)
FOREIGN_FLOOR_ROUNDOFFS = 16


def floor_caveats(
    a: VariantReader, b: VariantReader, c: VariantReader, layers: list[LayerDiff], text: str, kind: DiffVerdictKind
) -> tuple[str, DiffVerdictKind]:
    """No verdict where the floor cannot support the one given: 'within noise' against a floor that is another
    computation than A's (backend or kernels) and farther from A than rounding goes (A's distance from C then holds
    A's own departure, e.g. a kernel's bug, and any divergence from B reads as noise); 'beyond noise' where B is
    stored coarser than A (the floor measures A's finer rounding)."""
    a_dt, b_dt = a.record.dtype, b.record.dtype
    if kind == "within_noise":
        flat_a, flat_c = flatten(a.record.provenance), flatten(c.record.provenance)
        fields = sorted(f for f in set(flat_a) | set(flat_c) if f.startswith(COMPUTATION_FIELDS))
        foreign = [f"{f} ({flat_a.get(f)} vs {flat_c.get(f)})" for f in fields if flat_a.get(f) != flat_c.get(f)]
        u = UNIT_ROUNDOFF.get(a_dt)
        floor = max((L.floor_rel_l2 for L in layers if isinstance(L.floor_rel_l2, float)), default=0.0)
        if foreign and u and floor > FOREIGN_FLOOR_ROUNDOFFS * u:
            return (
                f"no verdict: the floor C is another computation than A (it differs in {', '.join(foreign)}) and A "
                f"is rel-L2 {floor:.3g} from it, {floor / u:.0f}x the {a_dt} unit roundoff: more than rounding, so "
                "any divergence from B reads as noise; pass A's own variant in a finer dtype as --floor; " + text,
                "inconclusive",
            )
    if kind == "beyond_noise" and coarser(a_dt, b_dt) != a_dt:
        return (
            f"no verdict: B ({b_dt}) is stored coarser than A ({a_dt}), so the floor (A's distance from C) "
            f"understates the pair's rounding; pass the coarser variant as A (hsstore diff B A --floor C); {text}",
            "inconclusive",
        )
    return text, kind


def estimate(layers: list[int], res: PassResult, j: int, plan: SamplePlan | None, ulps: bool) -> Estimate:
    if plan is None:
        return full_layers(layers, res.totals[j], ulps)
    return sampled_layers(layers, res.tables[j], plan.choice, ulps, plan.record.confidence, plan.record.seed)


def _floor_pass(
    a: VariantReader, c: VariantReader, layers: list[int], request: DiffRequest, compiled: bool
) -> Estimate:
    res = stream_pass(a, [c], shared_keys(a, c), layers, request, False, compiled)
    return full_layers(layers, res.totals[0], both_bf16(a, c))

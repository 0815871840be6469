"""Datasets that read cached states with matched provenance: map-style and streaming (DDP x workers).

Items: ``key``, ``input_ids`` [T] int64, ``loss_mask`` [T] bool, ``aux_hidden`` [T, n_aux, H] and
``target_hidden`` [T, n_target, H] in the stored dtype (bf16 stays torch.bfloat16). Only the requested
layers are read from disk. Variants stored in FP8 (``precision`` "fp8-e4m3") come back dequantized to
bf16 (exactly: hsstore.core.quant), or with ``raw=True`` as ``float8_e4m3fn`` codes plus ``aux_scales``
[T, n_aux, 1] and ``target_scales`` [T, n_target, 1] (float32; value = code * scale) for trainers that
dequantize on the GPU.

How the streaming dataset splits an epoch over ranks and workers, and why: hsstore.core.partition.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hsstore.core.errors import BadInput, CorruptData, ProvenanceMismatch
from hsstore.core.partition import epoch_sequence, split_for, worker_runs
from hsstore.core.provenance_match import require_match
from hsstore.core.schema.reports import AuditSummary
from hsstore.read.prefetch_reads import Fetched, Lookahead, Readahead, in_order
from hsstore.storage.info import audit_line, audits
from hsstore.storage.reader import VariantReader
from hsstore.storage.store import Store, split_target

# --- ``require=``: a dataset refuses a variant of other provenance than the one required — a provenance

# what ``require=`` takes: a provenance, a dataset (either form, or a training adapter over one:
# hsstore.interop.adapters), a reader or "STORE#SELECTOR"
Required: TypeAlias = "Mapping[str, Any] | _Base | VariantReader | str"


def resolve_provenance(required: Required) -> dict[str, Any]:
    """A provenance from a dict, a dataset, a VariantReader or a 'STORE#SELECTOR' string."""
    if isinstance(required, Mapping):
        return dict(required)
    if isinstance(getattr(required, "reader", None), VariantReader):  # a HiddenStateDataset (either form)
        return cast(_Base, required).provenance
    if isinstance(getattr(getattr(required, "base", None), "reader", None), VariantReader):
        return cast(_Base, required.base).provenance  # type: ignore[union-attr]  # a training adapter's dataset
    if isinstance(required, VariantReader):
        return required.record.provenance
    if isinstance(required, str):
        path, sel = split_target(required)
        s = Store.open(path)
        return s.variant_record(s.select(sel)).provenance
    raise TypeError(f"require= takes a provenance dict, a dataset (or a training adapter over one), a reader or "
                    f"'STORE#SELECTOR', not {type(required).__name__}")


def require_provenance(reader: VariantReader, required: Required, allow_drift: Iterable[str] | str | None = ()) -> None:
    """ProvenanceMismatch unless ``reader``'s variant has the ``required`` provenance (``allow_drift``: fields
    that may differ); the message ends with the variant's audits."""
    try:
        require_match(reader.record.provenance, resolve_provenance(required), allow_drift)
    except ProvenanceMismatch as e:
        notes = [f"variant {reader.id}: {audit_line(a)}" for a in audits(reader.store, reader.id)]
        raise ProvenanceMismatch(e.differences, notes=notes) from None


# --- The resumable state of a streaming dataset (``state_dict`` / ``load_state_dict``), checked as it is

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


def _inflate(data: bytes, size: int) -> bytes:
    """The marks a state packed, never more than ``size`` bytes (a state is input: no zip bomb)."""
    d = zlib.decompressobj()
    raw = d.decompress(data, size)
    if d.unconsumed_tail or not d.eof:
        raise ValueError("marks longer than the snapshot")
    return raw


def _unpack(text: str, n: int, old: bool) -> np.ndarray:
    try:
        raw = bytes.fromhex(text) if old else _inflate(base64.b64decode(text, validate=True), (n + 7) // 8)
    except (ValueError, zlib.error):
        raise BadInput(f"state['consumed'] is not the text state_dict() writes; {FIX}") from None
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:n]
    if bits.shape[0] != n:
        raise BadInput(f"state['consumed'] marks {bits.shape[0]} samples, not {n}; {FIX}")
    return bits.astype(bool)


def _check_fields(state: object) -> bool:
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
    for name in ("epoch", "seed", "n"):
        if not 0 <= state[name] < 2**62:
            raise BadInput(f"state[{name!r}] = {state[name]} is not a count from 0; {FIX}")
    if not old and state["format"] != FORMAT:
        raise BadInput(f"state is in format {state['format']}; this hsstore reads format {FORMAT} and the one "
                       "before it: resume with the hsstore that saved it")
    return old


def _units(raw: list[Any]) -> list[tuple[str, int]]:
    if not all(isinstance(u, (list, tuple)) and len(u) == 2 and isinstance(u[0], str) and isinstance(u[1], int)
               for u in raw):
        raise BadInput(f"state['units'] is not the [[unit id, samples], ...] list state_dict() writes; {FIX}")
    return [(u, int(c)) for u, c in raw]


def load_state(state: Mapping[str, Any], variant: str, n: int, seed: int) -> SavedState:
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


def check_join(new_samples: str) -> str:
    """When samples committed after a state was saved are trained: "next_epoch" or "this_epoch"."""
    if new_samples not in ("next_epoch", "this_epoch"):
        raise BadInput(f"new_samples={new_samples!r}; choose 'next_epoch' or 'this_epoch'")
    return new_samples


def snapshot(reader: VariantReader) -> list[tuple[str, int]]:
    """(unit id, samples it serves) of the units ``reader`` reads, in key order (= unit id order)."""
    return reader.unit_counts()


def save_state(epoch: int, seed: int, variant: str, units: list[tuple[str, int]], consumed: np.ndarray,
               gather: bool) -> dict[str, Any]:
    """The format-2 state; with torch.distributed initialized (and ``gather``) the marks of every rank."""
    if gather and torch.distributed.is_available() and torch.distributed.is_initialized():
        t = torch.from_numpy(consumed.astype(np.uint8))
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        consumed = t.numpy().astype(bool)
    return {"format": FORMAT, "epoch": epoch, "seed": seed, "n": int(consumed.shape[0]), "variant": variant,
            "units": [[u, c] for u, c in units], "digest": snapshot_digest(units), "consumed": pack_marks(consumed)}


def marks_by_key(reader: VariantReader, saved: SavedState, join: str) -> np.ndarray:
    """A state saved over another snapshot, as marks over ``reader``'s: its consumed samples by key, and
    (``join="next_epoch"``) the samples it did not know, held back to the next epoch. BadInput when a
    unit it names is not committed now or serves other samples."""
    try:
        then = VariantReader(reader.store, reader.id, units=[u for u, _ in saved.units or []])
    except CorruptData as e:
        raise BadInput(f"the state was saved over units of variant {reader.id} that are not committed now "
                       f"({str(e).split(';')[0]}): its marks cannot be tied to samples; start epoch "
                       f"{saved.epoch + 1} with set_epoch") from None
    if snapshot_digest(snapshot(then)) != saved.digest:
        raise BadInput(f"the units the state names serve other samples than when it was saved (digest "
                       f"{saved.digest}): its marks cannot be tied to samples; start epoch {saved.epoch + 1} with set_epoch")
    index = {k: i for i, k in enumerate(reader.keys)}
    then_keys = list(then.keys)
    marks = np.zeros(len(index), dtype=bool)
    done = [index[then_keys[i]] for i in np.flatnonzero(saved.consumed) if then_keys[i] in index]
    marks[np.asarray(done, np.int64)] = True
    if join == "next_epoch":
        known = set(then_keys)
        marks[np.asarray([i for k, i in index.items() if k not in known], np.int64)] = True
    return marks


class LiveMarks:
    """The epoch and marks a streaming dataset's DataLoader workers read when an iteration starts: torch
    tensors in shared memory (made before workers fork; spawned ones get them as shared memory when the
    dataset is pickled to them), written only by the main process. ``base``: the marks the ranks' split
    was fixed with (a loaded state's, the same on every rank); ``plan``: the marks this rank's workers'
    split was fixed with (at the last ``set_epoch`` that went on with the epoch); ``marks``: all of them.
    About n/4 bytes: 1.25 MB for 5M samples."""

    def __init__(self, n: int) -> None:
        self.n, size = n, max(1, (n + 7) // 8)
        # (torch's Tensor.share_memory_ has no annotations)
        self.ctl: torch.Tensor = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]  # [epoch]
        self.t: dict[str, torch.Tensor] = {name: torch.zeros(size, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
                                           for name in ("base", "plan", "marks")}

    @property
    def epoch(self) -> int:
        return int(self.ctl[0])

    def bits(self, name: str) -> np.ndarray:
        return np.unpackbits(self.t[name].numpy())[: self.n].astype(bool)

    def start(self, epoch: int, marks: np.ndarray) -> None:
        """Epoch ``epoch`` with ``marks`` (bool [n]) consumed; the split is fixed with them."""
        packed = np.zeros(self.t["marks"].shape[0], np.uint8)
        packed[: (self.n + 7) // 8] = np.packbits(marks)
        for t in self.t.values():
            t.numpy()[:] = packed
        self.ctl[0] = epoch

    def replan(self) -> None:
        """This rank's workers share out what is left of its run (the marks made so far are a prefix)."""
        self.t["plan"].numpy()[:] = self.t["marks"].numpy()

    def mark(self, idx: np.ndarray) -> None:
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            bad = int(idx.max() if idx.max() >= self.n else idx.min())
            raise BadInput(f"mark_consumed: index {bad} is not one of this dataset's {self.n} samples; pass batch['index']")
        np.bitwise_or.at(self.t["marks"].numpy(), idx >> 3, (128 >> (idx & 7)).astype(np.uint8))


# --- Padding dataset items into a batch.

REQUIRED = ("input_ids", "loss_mask")
STATES = ("aux_hidden", "target_hidden", "aux_scales", "target_scales")
OPTIONAL = ("key", "index")  # a dataset's items carry them; items built elsewhere may not: kept when all do


def _check_items(items: Sequence[dict[str, Any]]) -> list[str]:
    """The fields every item has that the batch carries; BadInput naming the field and the item when an
    item lacks one the batch needs (``input_ids``, ``loss_mask``, or a state field the first item has)."""
    if not items:
        raise BadInput("pad_collate got no items; pass a non-empty list of dataset items")
    first = items[0]
    states = [k for k in STATES if k in first]
    for n, it in enumerate(items):
        missing = [k for k in (*REQUIRED, *states) if k not in it]
        if missing:
            raise BadInput(f"pad_collate: item {n} has no {', '.join(repr(k) for k in missing)} (it has "
                           f"{sorted(it)}); pass items as HiddenStateDataset returns them, each with "
                           f"{', '.join(REQUIRED)} and the same state fields")
    return [k for k in OPTIONAL if all(k in it for it in items)] + states


def pad_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Right-pad items into a batch with ``attention_mask`` (True = real token). ``key`` and ``index``
    are carried when every item has them (items built outside a dataset may have neither); an item
    without ``input_ids``, ``loss_mask`` or a state field the first item has is a BadInput naming it."""
    fields = _check_items(items)
    T = max(it["input_ids"].shape[0] for it in items)
    B = len(items)
    first = items[0]
    out: dict[str, Any] = {
        "input_ids": torch.zeros((B, T), dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.bool),
        "attention_mask": torch.zeros((B, T), dtype=torch.bool),
    }
    if "key" in fields:
        out["key"] = [it["key"] for it in items]
    if "index" in fields:
        out["index"] = torch.tensor([it["index"] for it in items], dtype=torch.long)
    padded = [k for k in STATES if k in fields]
    for k in padded:  # (float8 codes are padded through their bytes: zeros either way)
        x = first[k].view(torch.uint8) if first[k].dtype == torch.float8_e4m3fn else first[k]
        out[k] = torch.zeros((B, T, *x.shape[1:]), dtype=x.dtype)
    for b, it in enumerate(items):
        n = it["input_ids"].shape[0]
        out["input_ids"][b, :n] = it["input_ids"]
        out["loss_mask"][b, :n] = it["loss_mask"]
        out["attention_mask"][b, :n] = True
        for k in padded:
            out[k][b, :n] = it[k].view(torch.uint8) if it[k].dtype == torch.float8_e4m3fn else it[k]
    for k in padded:
        if first[k].dtype == torch.float8_e4m3fn:
            out[k] = out[k].view(torch.float8_e4m3fn)
    return out


# a dataset's store: an open Store, or its path or URL ("STORE#SELECTOR" too)
StoreArg: TypeAlias = "Store | str | os.PathLike[str]"


def _open(store: StoreArg, variant: str | None) -> VariantReader:
    if isinstance(store, Store):
        s, sel = store, variant
    else:
        path, sel_in_path = split_target(str(store))
        s, sel = Store.open(path), variant if variant is not None else sel_in_path
    reader = s.reader(s.select(sel))
    reader.check_corrupt_commits()
    return reader


class _Base:
    """Shared opening, provenance check and item assembly."""

    def _setup(self, store: StoreArg, variant: str | None, layers: Sequence[int] | None, require: Required | None,
               allow_drift: Iterable[str] | str | None, raw: bool = False) -> None:
        self.reader = _open(store, variant)
        self._pid = os.getpid()
        rec = self.reader.record
        if raw and not rec.stored_precision:
            raise BadInput(f"raw=True reads FP8 codes and scales; variant {self.reader.id} is stored as computed "
                           f"({rec.dtype}): read it without raw=True")
        self.raw = raw
        if require is not None:
            require_provenance(self.reader, require, allow_drift)
        stored = rec.all_layers
        want = stored if layers is None else sorted(set(layers))
        bad = [i for i in want if i not in stored]
        if bad:
            raise BadInput(f"layer(s) {bad} are not stored in variant {self.reader.id}; stored: {stored}")
        # layers are handed out by role, so a target layer can never end up among the conditioning ones
        self.layer_roles = {role: [i for i in ids if i in want] for role, ids in rec.layers.items()}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.reader.record.provenance

    @property
    def audits(self) -> list[AuditSummary]:
        """What ``hsstore import --audit N`` found, oldest first: when, against which model, the verdict."""
        return audits(self.reader.store, self.reader.id)

    @property
    def precision(self) -> str | None:
        """How the states are stored when not as computed (e.g. "fp8-e4m3"), else None."""
        return self.reader.record.stored_precision

    def __getstate__(self) -> dict[str, Any]:
        # for spawn/forkserver workers: reopen the store there, reading the units this dataset opened with
        state = self.__dict__.copy()
        state.pop("_ahead", None)  # its thread and lock stay here: a worker starts its own
        state["reader"] = (self.reader.store.location, self.reader.id, list(self.reader.units))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        location, vid, units = state["reader"]
        self.__dict__.update(state)
        self.reader = VariantReader(Store.open(location), vid, units=units)
        self._pid = os.getpid()

    @property
    def hidden_size(self) -> int:
        return self.reader.record.hidden_size

    @property
    def variant_id(self) -> str:
        return self.reader.id

    def _reader_here(self) -> VariantReader:
        """The reader, reopened after a fork for remote stores (their clients are bound to the parent's
        event loop; local files are safe to share)."""
        pid = os.getpid()
        if getattr(self, "_pid", pid) != pid and not self.reader.store.is_local:
            self.reader = VariantReader(Store.open(self.reader.store.location), self.reader.id, units=list(self.reader.units))
        self._pid = pid
        return self.reader

    def _item(self, index: int, fetched: Fetched | None = None) -> dict[str, Any]:
        self._reader_here()
        ref = self.reader.ref(index)
        ids, mask = self.reader.read_tokens(ref) if fetched is None else fetched.tokens
        item = {
            "key": ref.key,
            "index": index,
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(mask.astype(np.bool_)),
        }
        roles = ("aux", "target")
        groups = self.reader.read_groups(ref, [self.layer_roles.get(r, []) for r in roles], self.raw,
                                         None if fetched is None else fetched.chunks)
        for role, states in zip(roles, groups):  # all layers of the sample read in one pass
            if isinstance(states, tuple):  # raw FP8: codes and their scales
                item[f"{role}_hidden"], item[f"{role}_scales"] = states
            else:
                item[f"{role}_hidden"] = states
        return item


class HiddenStateDataset(_Base, Dataset[dict[str, Any]]):
    """Map-style dataset over one variant; ``require=`` refuses a store of other provenance.

    Example: ``HiddenStateDataset("cache.zarr", variant="backend=torch,dtype=bf16", require=train.provenance)``
    """

    def __init__(self, store: StoreArg, variant: str | None = None, layers: Sequence[int] | None = None,
                 require: Required | None = None, allow_drift: Iterable[str] | str | None = (), raw: bool = False) -> None:
        self._setup(store, variant, layers, require, allow_drift, raw)

    def __len__(self) -> int:
        return len(self.reader.keys)

    def __getitem__(self, index: int) -> dict[str, Any]:
        try:
            i = index.__index__()  # ints, numpy integers, 0-d integer tensors; never 1.5 or "3"
        except (AttributeError, TypeError):
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__} ({index!r})") from None
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} is out of range for {len(self)} samples")
        i, ahead = i % len(self), self._lookahead()
        fetched = ahead.take(i)
        try:
            return self._item(i, fetched)
        finally:
            ahead.done(fetched)

    def _lookahead(self) -> Lookahead:
        """This process's Lookahead over this reader (threads do not survive a fork)."""
        reader, ahead = self._reader_here(), self.__dict__.get("_ahead")
        if ahead is None or ahead.pid != os.getpid() or ahead.reader is not reader:
            ahead = self._ahead = Lookahead(reader, sorted({i for ids in self.layer_roles.values() for i in ids}))
        return ahead

    @property
    def keys(self) -> list[str]:
        return list(self.reader.keys)


class StreamingHiddenStateDataset(_Base, IterableDataset[dict[str, Any]]):
    """Iterable dataset for DDP training: every sample exactly once per epoch over ranks x workers, and a
    resume (``state_dict`` / ``load_state_dict``) that continues the epoch exactly.

    - each rank takes a contiguous run of the epoch order (``remainder="keep"``: ranks may differ by one
      sample; ``"drop"``: the last ``len % world`` wait for a later epoch); its DataLoader workers take
      that run's items (or ``batch_tokens`` batches) in turn: the loader yields the run in order;
    - the order is a function of (seed, epoch, the committed snapshot) only;
    - ``set_epoch``, ``mark_consumed`` and ``load_state_dict`` in the main process write a shared-memory
      block every worker reads when its iteration starts (persistent, spawned or forked workers follow);
    - ``set_epoch(e)`` starts epoch ``e``; for the epoch in progress it goes on, unless nothing is left;
    - ``state_dict()`` names its snapshot (units, digest): on a store changed since, ``load_state_dict``
      carries marks over by key; new samples join next epoch (``new_samples="this_epoch"``: this one);
    - ``batch_tokens=N`` yields padded batches of at most N (padded) tokens instead of single items;
    - ``prefetch=K`` reads the next K samples on threads (default: 8 on remote stores such as ``s3://``,
      where every read is a round trip; 0 on local disks);
    - ``readahead`` (local stores, default on): the kernel reads about 192 MiB of the coming samples'
      bytes ahead while the current one decodes (hsstore.read.prefetch_reads).
    """

    def __init__(self, store: StoreArg, variant: str | None = None, layers: Sequence[int] | None = None,
                 require: Required | None = None, allow_drift: Iterable[str] | str | None = (), seed: int = 0, shuffle: bool = True,
                 batch_tokens: int | None = None, remainder: str = "keep", rank: int | None = None,
                 world_size: int | None = None, prefetch: int | None = None, raw: bool = False,
                 readahead: bool = True, new_samples: str = "next_epoch") -> None:
        if remainder not in ("keep", "drop"):
            raise BadInput(f"remainder={remainder!r}; choose 'keep' or 'drop'")
        self.new_samples = check_join(new_samples)
        self._setup(store, variant, layers, require, allow_drift, raw)
        if not 0 <= int(seed) < 2**62:
            raise BadInput(f"seed={seed}: a seed is a whole number from 0 (numpy's generators take no negative seed)")
        self.seed, self.shuffle, self.batch_tokens, self.remainder = seed, shuffle, batch_tokens, remainder
        self._rank, self._world = rank, world_size
        self.prefetch, self.readahead = (prefetch if prefetch is not None else 0 if self.reader.store.is_local else 8), readahead
        self.snapshot = snapshot(self.reader)
        self.digest, self.unit_sizes, self.n = snapshot_digest(self.snapshot), [c for _, c in self.snapshot], len(self.reader.keys)
        self.live = LiveMarks(self.n)  # what DataLoader workers read when an iteration starts
        self._resumed: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # a spawned worker has no process group: it keeps its parent's rank
        state["_world"], state["_rank"] = self._world_and_rank()
        return state

    def __len__(self) -> int:
        return self.n

    @property
    def epoch(self) -> int:
        return self.live.epoch

    @property
    def consumed(self) -> np.ndarray:
        """bool [n]: the samples marked consumed in this epoch (by index into this snapshot's keys)."""
        return self.live.bits("marks")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (fresh marks); the epoch in progress goes on unless nothing of it is left."""
        epoch = int(epoch)
        if not 0 <= epoch < 2**62:
            raise BadInput(f"set_epoch({epoch}): an epoch is a count from 0")
        if self._resumed is not None and epoch < self._resumed:
            raise BadInput(f"set_epoch({epoch}) after load_state_dict of a state in epoch {self._resumed} would drop "
                           f"the resume; call set_epoch({self._resumed}) (Accelerate: loader.set_epoch({self._resumed}))")
        if epoch == self.epoch and any(len(r) for r in self._runs(whole_rank=True)):
            self.live.replan()  # the workers share out what is left, in order
            return
        self._resumed = None
        self.live.start(epoch, np.zeros(self.n, dtype=bool))

    def mark_consumed(self, indices: Iterable[int] | torch.Tensor) -> None:
        """Record samples the training loop has finished with (call in the main process)."""
        raw = indices.tolist() if isinstance(indices, torch.Tensor) else indices
        self.live.mark(np.asarray(raw if isinstance(raw, (int, np.integer)) else list(raw), np.int64).ravel())

    def state_dict(self, gather: bool = True) -> dict[str, Any]:
        """Resumable state (JSON-ready, compact); with torch.distributed initialized (and ``gather``) it
        merges every rank's."""
        return save_state(self.epoch, self.seed, self.variant_id, self.snapshot, self.consumed, gather)

    def load_state_dict(self, state: Mapping[str, Any], new_samples: str | None = None) -> None:
        """Resume ``state`` (state_dict()'s; anything else is one BadInput), by sample key when the store
        changed (class docstring); live workers follow at their next iteration."""
        join = check_join(new_samples or self.new_samples)
        saved = load_state(state, self.variant_id, self.n, self.seed)
        same = saved.units is None or saved.digest == self.digest
        self.live.start(saved.epoch, saved.consumed if same else marks_by_key(self.reader, saved, join))
        self._resumed = saved.epoch

    def _world_and_rank(self) -> tuple[int, int]:
        if self._world is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return int(self._world or 1), int(self._rank or 0)

    def _runs(self, whole_rank: bool = False) -> list[np.ndarray]:
        """This (rank, worker)'s unconsumed items (one run) or batches (a run each), in order. The split is
        fixed by marks the main process froze (``load_state_dict``, ``set_epoch``): later marks only drop
        samples (re-iterating without ``set_epoch`` gets each once, the workers' turns possibly shifted)."""
        info = None if whole_rank else get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        seq = self._rank_seq()
        lengths = [self.reader.ref(int(i)).length for i in seq] if self.batch_tokens else None
        return worker_runs(seq, workers, worker, self.consumed, lengths, self.batch_tokens)

    def _rank_seq(self) -> np.ndarray:
        """This rank's samples of the epoch in order, as the split was fixed (consumed ones included)."""
        order = epoch_sequence(self.unit_sizes, self.seed, self.epoch, self.shuffle)
        order = order[~self.live.bits("base")[order]]
        world, rank = self._world_and_rank()
        seq = split_for(order, world, rank, drop_remainder=self.remainder == "drop")
        unplanned: np.ndarray = seq[~self.live.bits("plan")[seq]]  # (numpy types a fancy index as Any)
        return unplanned

    def _check_not_spent(self) -> None:
        """BadInput when every sample of this rank's epoch is marked consumed: iterating would silently train
        on nothing (a loop that marks samples but never calls set_epoch)."""
        seq = self._rank_seq()
        if len(seq) and self.consumed[seq].all():
            raise BadInput(f"epoch {self.epoch} is fully consumed (every sample of this rank is marked with "
                           f"mark_consumed): call set_epoch({self.epoch + 1}) before iterating again")

    def _items(self, indices: np.ndarray) -> Generator[dict[str, Any], None, None]:
        """Items in order, read ahead by the kernel (local, ``readahead``) and threads (``prefetch``)."""
        ahead = None
        if self.readahead and self.reader.store.is_local and len(indices):
            layers = sorted({i for ids in self.layer_roles.values() for i in ids})
            ahead = Readahead(self.reader, [self.reader.ref(int(i)) for i in indices], layers)
        try:
            yield from in_order(self._item, [int(i) for i in indices], self.prefetch, None if ahead is None else ahead.at)
        finally:
            if ahead is not None:
                ahead.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        runs = self._runs()  # the epoch and marks are read here, when this iteration starts
        if not any(len(r) for r in runs):
            self._check_not_spent()
        items = self._items(np.concatenate(runs) if runs else np.zeros(0, np.int64))
        try:
            if not self.batch_tokens:
                yield from items
                return
            for run in runs:
                yield pad_collate([next(items) for _ in range(len(run))])
        finally:
            items.close()

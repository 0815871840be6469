"""Datasets that read cached states with matched provenance: map-style and streaming (DDP x workers).

Items: ``key``, ``input_ids`` [T] int64, ``loss_mask`` [T] bool, ``aux_hidden`` [T, n_aux, H] and
``target_hidden`` [T, n_target, H] in the stored dtype (bf16 stays torch.bfloat16). Only the requested
layers are read from disk. Variants stored in FP8 (``precision`` "fp8-e4m3") come back dequantized to
bf16 (exactly: hsstore.core.quant), or with ``raw=True`` as ``float8_e4m3fn`` codes plus ``aux_scales``
[T, n_aux, 1] and ``target_scales`` [T, n_target, 1] (float32; value = code * scale) for trainers that
dequantize on the GPU.

Streaming split (StreamingHiddenStateDataset). Each rank takes a contiguous run of the epoch order; inside a
rank, DataLoader worker ``w`` of ``W`` takes delivery units ``w, w + W, ...`` of that run (items, or whole
``batch_tokens`` batches cut from the run before it is shared out). The DataLoader asks its workers in turn,
so it yields exactly the rank's run in order, whatever the number of workers: the samples a training loop
has consumed are a prefix of the run, and a resume (the run without them) continues the uninterrupted
order, also with another number of workers. The cost is read locality: a worker reads every W-th sample of
a unit instead of one contiguous W-th of it. Inside a unit the order is shuffled anyway, so a worker never
read a unit front to back; it still reads only the rank's units (a rank's run is contiguous), each unit's
files are opened by W workers instead of about one, and the kernel's readahead follows each worker's own
samples. Contiguous runs per worker would make the loader's order depend on the worker count and leave a
resumed epoch in another order than an uninterrupted one. A DataLoader that batches items itself
(``batch_size`` > 1) with several workers takes that many items from one worker at a time: every sample
is still served once, but the resumed order can differ; ``batch_tokens`` batches (made here, with
``batch_size=None``) keep it exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.partition import epoch_sequence, split_for, strided, token_batches
from hsstore.core.schema.info_report import AuditSummary
from hsstore.read.collate import pad_collate
from hsstore.read.resume_state import FORMAT, SavedState, load_state, pack_marks, snapshot_digest
from hsstore.read.lookahead import Fetched, Lookahead
from hsstore.read.prefetch import in_order
from hsstore.read.readahead import Readahead
from hsstore.read.requirement import require_provenance
from hsstore.storage.audits import audits
from hsstore.storage.store import Store, VariantReader, split_target


def _open(store: Any, variant: str | None) -> VariantReader:
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

    def _setup(self, store: Any, variant: str | None, layers: Sequence[int] | None, require: Any,
               allow_drift: Iterable[str], raw: bool = False) -> None:
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
        groups = self.reader.read_groups(ref, [self.layer_roles.get(r, []) for r in roles], self.raw, fetched and fetched.chunks)
        for role, states in zip(roles, groups):  # all layers of the sample read in one pass
            if isinstance(states, tuple):  # raw FP8: codes and their scales
                item[f"{role}_hidden"], item[f"{role}_scales"] = states
            else:
                item[f"{role}_hidden"] = states
        return item


class HiddenStateDataset(_Base, Dataset):
    """Map-style dataset over one variant; ``require=`` refuses a store of other provenance.

    Example: ``HiddenStateDataset("cache.zarr", variant="backend=torch,dtype=bf16", require=train.provenance)``
    """

    def __init__(self, store: Any, variant: str | None = None, layers: Sequence[int] | None = None,
                 require: Any = None, allow_drift: Iterable[str] = (), raw: bool = False) -> None:
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


class StreamingHiddenStateDataset(_Base, IterableDataset):
    """Iterable dataset for DDP training: every sample exactly once per epoch over ranks x workers, and a
    resume (``state_dict`` / ``load_state_dict``) that continues the epoch exactly.

    - each rank takes a contiguous run of the epoch order (``remainder="keep"``: ranks may differ by one
      sample; ``"drop"``: the last ``len % world`` samples wait for a later epoch so every rank gets the
      same count); its DataLoader workers take that run's delivery units (items, or ``batch_tokens``
      batches) in turn, so the loader yields the rank's run in order (module docstring: why);
    - the order is a function of (seed, epoch, the committed snapshot) only;
    - the epoch, the consumed marks and a loaded state live in a small shared-memory block the main process
      writes (``set_epoch``, ``mark_consumed``, ``load_state_dict``) and every worker reads when its
      iteration starts: persistent workers, spawn / forkserver / fork, any ``prefetch_factor`` follow them;
    - ``set_epoch(e)`` starts epoch ``e``; for the epoch in progress (after ``load_state_dict``, or
      Accelerate's call at each iteration) it goes on where it stood, unless nothing of it is left;
    - ``mark_consumed(batch["index"])`` + ``state_dict()`` / ``load_state_dict()``: the state names its
      snapshot (units, digest); on a store that changed since, marks are carried over by sample key and
      samples committed since join at the next epoch (``new_samples="this_epoch"``: this one);
    - ``batch_tokens=N`` yields padded batches of at most N (padded) tokens instead of single items;
    - ``prefetch=K`` reads the next K samples on threads (default: 8 on remote stores such as ``s3://``,
      where every read is a round trip; 0 on local disks);
    - ``readahead`` (local stores, default on): the kernel reads about 192 MiB of the coming samples'
      bytes ahead while the current one decodes (hsstore.read.readahead).
    """

    def __init__(self, store: Any, variant: str | None = None, layers: Sequence[int] | None = None,
                 require: Any = None, allow_drift: Iterable[str] = (), seed: int = 0, shuffle: bool = True,
                 batch_tokens: int | None = None, remainder: str = "keep", rank: int | None = None,
                 world_size: int | None = None, prefetch: int | None = None, raw: bool = False,
                 readahead: bool = True, new_samples: str = "next_epoch") -> None:
        if remainder not in ("keep", "drop"):
            raise BadInput(f"remainder={remainder!r}; choose 'keep' or 'drop'")
        self.new_samples = _check_join(new_samples)
        self._setup(store, variant, layers, require, allow_drift, raw)
        self.seed, self.shuffle, self.batch_tokens, self.remainder = seed, shuffle, batch_tokens, remainder
        self._rank, self._world = rank, world_size
        self.prefetch = prefetch if prefetch is not None else (0 if self.reader.store.is_local else 8)
        self.readahead = readahead
        self.snapshot = _snapshot(self.reader)
        self.digest = snapshot_digest(self.snapshot)
        self.unit_sizes = [c for _, c in self.snapshot]
        self.n = int(sum(self.unit_sizes))
        # shared with DataLoader workers (before they fork, or pickled to spawned ones as shared memory):
        # [epoch]; the marks the ranks' split was fixed with (a loaded state's, the same on every rank); the
        # marks this rank's workers' split was fixed with (this rank's, at the last set_epoch); all marks
        nbytes = max(1, (self.n + 7) // 8)
        self._ctl = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._base, self._plan, self._marks = (torch.zeros(nbytes, dtype=torch.uint8).share_memory_() for _ in "bpm")
        self._resumed: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # a spawned worker has no process group: it keeps the rank and world of the process that made it
        state["_world"], state["_rank"] = self._world_and_rank()
        return state

    def __len__(self) -> int:
        return self.n

    @property
    def epoch(self) -> int:
        return int(self._ctl[0])

    @property
    def consumed(self) -> np.ndarray:
        """bool [n]: the samples marked consumed in this epoch (by index into this snapshot's keys)."""
        return self._bits(self._marks)

    def _bits(self, t: torch.Tensor) -> np.ndarray:
        return np.unpackbits(t.numpy())[: self.n].astype(bool)

    def _write(self, epoch: int, marks: np.ndarray) -> None:
        packed = np.zeros(self._marks.shape[0], np.uint8)
        packed[: (self.n + 7) // 8] = np.packbits(marks)
        for t in (self._base, self._plan, self._marks):
            t.numpy()[:] = packed
        self._ctl[0] = epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (fresh marks); the epoch in progress goes on unless nothing of it is left."""
        epoch = int(epoch)
        if self._resumed is not None and epoch < self._resumed:
            raise BadInput(f"set_epoch({epoch}) after load_state_dict of a state in epoch {self._resumed} would "
                           f"train an earlier epoch and drop the resume; call set_epoch({self._resumed}) "
                           f"(Accelerate: loader.set_epoch({self._resumed}))")
        if epoch == self.epoch and any(len(r) for r in self._runs(1, 0)):
            self._plan.numpy()[:] = self._marks.numpy()  # the workers share out what is left, in order
            return
        self._resumed = None
        self._write(epoch, np.zeros(self.n, dtype=bool))

    def mark_consumed(self, indices: Iterable[int] | torch.Tensor) -> None:
        """Record samples the training loop has finished with (call in the main process)."""
        raw = indices.tolist() if isinstance(indices, torch.Tensor) else indices
        idx = np.asarray(raw if isinstance(raw, (int, np.integer)) else list(raw), np.int64).ravel()
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise BadInput(f"mark_consumed: index {int(idx.max() if idx.max() >= self.n else idx.min())} is not "
                           f"one of this dataset's {self.n} samples; pass batch['index']")
        np.bitwise_or.at(self._marks.numpy(), idx >> 3, (128 >> (idx & 7)).astype(np.uint8))

    def state_dict(self, gather: bool = True) -> dict[str, Any]:
        """Resumable state; with torch.distributed initialized (and ``gather``) it merges every rank's.
        Compact: the snapshot's unit ids and counts, its digest and a compressed bitmask (JSON-ready)."""
        consumed = self.consumed
        if gather and torch.distributed.is_available() and torch.distributed.is_initialized():
            t = torch.from_numpy(consumed.astype(np.uint8))
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            consumed = t.numpy().astype(bool)
        return {"format": FORMAT, "epoch": self.epoch, "seed": self.seed, "n": self.n, "variant": self.variant_id,
                "units": [[u, c] for u, c in self.snapshot], "digest": self.digest,
                "consumed": pack_marks(consumed)}

    def load_state_dict(self, state: Mapping[str, Any], new_samples: str | None = None) -> None:
        """Resume ``state`` (state_dict()'s; anything else is one BadInput). Same snapshot: exactly where it
        stood. A store changed since: the marks follow their samples' keys, and samples committed since
        join at the next epoch (``new_samples="this_epoch"``: this one). Live workers follow at their
        next iteration."""
        join = _check_join(new_samples or self.new_samples)
        saved = load_state(state, self.variant_id, self.n, self.seed)
        same = saved.units is None or saved.digest == self.digest
        self._write(saved.epoch, saved.consumed if same else self._marks_by_key(saved, join))
        self._resumed = saved.epoch

    def _marks_by_key(self, saved: SavedState, join: str) -> np.ndarray:
        """A state saved over another snapshot, as marks over this one: its consumed samples by key, and
        (``join="next_epoch"``) the samples it did not know, held back to the next epoch."""
        units = [u for u, _ in saved.units or []]
        try:
            then = VariantReader(self.reader.store, self.variant_id, units=units)
        except CorruptData as e:
            raise BadInput(f"the state was saved over units of variant {self.variant_id} that are not committed "
                           f"now ({str(e).split(';')[0]}): its marks cannot be tied to samples; start epoch "
                           f"{saved.epoch + 1} with set_epoch") from None
        if snapshot_digest(_snapshot(then)) != saved.digest:
            raise BadInput(f"the units the state names serve other samples now than when it was saved "
                           f"(digest {saved.digest}); start epoch {saved.epoch + 1} with set_epoch")
        index = {k: i for i, k in enumerate(self.reader.keys)}
        then_keys = list(then.keys)
        marks = np.zeros(self.n, dtype=bool)
        done = [index[then_keys[i]] for i in np.flatnonzero(saved.consumed) if then_keys[i] in index]
        marks[np.asarray(done, np.int64)] = True
        if join == "next_epoch":
            known = set(then_keys)
            marks[np.asarray([i for k, i in index.items() if k not in known], np.int64)] = True
        return marks

    def _world_and_rank(self) -> tuple[int, int]:
        if self._world is not None:
            return int(self._world), int(self._rank or 0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def _runs(self, workers: int, worker: int) -> list[np.ndarray]:
        """This (rank, worker)'s delivery units of the epoch not yet consumed, in order: one run of items,
        or one run per ``batch_tokens`` batch. The split is fixed by marks the main process froze
        (``load_state_dict``, ``set_epoch``): marks made while workers start never move a sample to another
        worker; later marks only drop samples (a loop that breaks and iterates again without ``set_epoch``
        gets each sample once, the workers' turns possibly shifted)."""
        order = epoch_sequence(self.unit_sizes, self.seed, self.epoch, self.shuffle)
        order = order[~self._bits(self._base)[order]]
        world, rank = self._world_and_rank()
        seq = split_for(order, world, rank, drop_remainder=self.remainder == "drop")
        seq = seq[~self._bits(self._plan)[seq]]
        marks = self.consumed
        if not self.batch_tokens:
            mine = strided(seq, workers, worker)
            return [mine[~marks[mine]]]
        cuts = token_batches([self.reader.ref(int(i)).length for i in seq], self.batch_tokens)
        runs = [seq[a:b] for a, b in cuts[worker::workers]]
        return [r for r in (r[~marks[r]] for r in runs) if len(r)]

    def my_indices(self) -> np.ndarray:
        """This (rank, worker)'s samples for the current epoch, in order (pure given the state)."""
        info = get_worker_info()
        runs = self._runs(*((info.num_workers, info.id) if info is not None else (1, 0)))
        return np.concatenate(runs) if runs else np.zeros(0, np.int64)

    def _items(self, indices: np.ndarray) -> Iterator[dict[str, Any]]:
        """Items in order; the kernel reads the next ones' bytes ahead (local stores, ``readahead``), and
        with ``prefetch`` the next ones are already being read on threads."""
        ahead = None
        if self.readahead and self.reader.store.is_local and len(indices):
            layers = sorted({i for ids in self.layer_roles.values() for i in ids})
            ahead = Readahead(self.reader, [self.reader.ref(int(i)) for i in indices], layers)
        try:
            yield from in_order(self._item, [int(i) for i in indices], self.prefetch, ahead and ahead.at)
        finally:
            if ahead is not None:
                ahead.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()  # the epoch and marks are read here, when this iteration starts
        runs = self._runs(*((info.num_workers, info.id) if info is not None else (1, 0)))
        items = self._items(np.concatenate(runs) if runs else np.zeros(0, np.int64))
        try:
            if not self.batch_tokens:
                yield from items
                return
            for run in runs:
                yield pad_collate([next(items) for _ in range(len(run))])
        finally:
            items.close()


def _check_join(new_samples: str) -> str:
    if new_samples not in ("next_epoch", "this_epoch"):
        raise BadInput(f"new_samples={new_samples!r}; choose 'next_epoch' or 'this_epoch'")
    return new_samples


def _snapshot(reader: VariantReader) -> list[tuple[str, int]]:
    """(unit id, samples it serves) of the units ``reader`` reads, in key order (= unit id order)."""
    counts: dict[str, int] = {}
    for k in reader.keys:
        u = reader.ref(k).unit
        counts[u] = counts.get(u, 0) + 1
    return list(counts.items())

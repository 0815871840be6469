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

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hsstore.core.errors import BadInput
from hsstore.core.partition import epoch_sequence, split_for, worker_runs
from hsstore.core.schema.info_report import AuditSummary
from hsstore.read.collate import pad_collate
from hsstore.read.resume_state import (LiveMarks, check_join, load_state, marks_by_key, save_state, snapshot,
                                       snapshot_digest)
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
      bytes ahead while the current one decodes (hsstore.read.readahead).
    """

    def __init__(self, store: Any, variant: str | None = None, layers: Sequence[int] | None = None,
                 require: Any = None, allow_drift: Iterable[str] = (), seed: int = 0, shuffle: bool = True,
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
        return seq[~self.live.bits("plan")[seq]]

    def _check_not_spent(self) -> None:
        """BadInput when every sample of this rank's epoch is marked consumed: iterating would silently train
        on nothing (a loop that marks samples but never calls set_epoch)."""
        seq = self._rank_seq()
        if len(seq) and self.consumed[seq].all():
            raise BadInput(f"epoch {self.epoch} is fully consumed (every sample of this rank is marked with "
                           f"mark_consumed): call set_epoch({self.epoch + 1}) before iterating again")

    def _items(self, indices: np.ndarray) -> Iterator[dict[str, Any]]:
        """Items in order, read ahead by the kernel (local, ``readahead``) and threads (``prefetch``)."""
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


"""The streaming dataset for DDP training: every sample once per epoch over ranks x DataLoader workers, and a
resume that continues the epoch exactly (its saved state and live marks: hsstore.read.stream_state).

Its items are the map-style dataset's (hsstore.read.dataset), each with the ``epoch`` and ``epoch_start`` it
was read in; with ``batch_tokens`` it yields them padded into batches (``pad_collate``).

How the streaming dataset splits an epoch over ranks and workers, and why: hsstore.core.partition.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from hsstore.core.errors import BadInput
from hsstore.core.partition import epoch_sequence, split_for, token_batches, worker_runs
from hsstore.read.dataset import DatasetBase, Required, StoreArg, pad_collate
from hsstore.read.prefetch_reads import Readahead, in_order
from hsstore.read.stream_state import (
    LiveMarks,
    agreed_snapshot,
    check_join,
    int_array,
    load_state,
    marks_by_key,
    same_stamp,
    save_state,
    snapshot_digest,
)


def _check_settings(seed: int, shuffle: bool, rank: int | None, world_size: int | None) -> None:
    """BadInput for a ``seed`` that is not a whole number from 0, a ``shuffle`` that is not True or False, or a
    ``rank`` or ``world_size`` given that is not a whole number (from 0, and from 1)."""
    if not 0 <= int(seed) < 2**62:
        raise BadInput(f"seed={seed}: a seed is a whole number from 0 (numpy's generators take no negative seed)")
    if not isinstance(shuffle, bool):
        raise BadInput(f"shuffle={shuffle!r}; pass True or False")
    for name, value, least in (("world_size", world_size, 1), ("rank", rank, 0)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least):
            raise BadInput(f"{name}={value!r}: a whole number from {least}")


class StreamingHiddenStateDataset(DatasetBase, IterableDataset[dict[str, Any]]):
    """Iterable dataset for DDP training: every sample exactly once per epoch over ranks x workers, and a
    resume (``state_dict`` / ``load_state_dict``) that continues the epoch exactly.

    - each rank takes a contiguous run of the epoch order (``remainder="keep"``: ranks may differ by one
      sample; ``"drop"``: the last ``len % world`` wait for a later epoch, and with ``batch_tokens`` every
      rank takes the fewest batches any rank cuts: DDP's steps stay in step); its DataLoader workers take
      that run's items (or ``batch_tokens`` batches) in turn: the loader yields the run in order;
    - the order is a function of (seed, epoch, the committed snapshot) only;
    - ``set_epoch``, ``mark_consumed`` and ``load_state_dict`` in the main process write a shared-memory
      block every worker reads when its iteration starts (persistent, spawned or forked workers follow);
    - ``set_epoch(e)`` starts epoch ``e``; for the epoch in progress it goes on (``set_epoch``'s docstring);
    - each item carries ``epoch`` and ``epoch_start``, the epoch its iteration began in and which start of it
      (set_epoch, load_state_dict): ``mark_consumed(batch)`` leaves out late marks of an earlier pass;
    - ``state_dict()`` names its snapshot (units, digest): on a store changed since, ``load_state_dict``
      carries marks over by key; new samples join next epoch (``new_samples="this_epoch"``: this one);
    - ``batch_tokens=N`` yields padded batches of at most N (padded) tokens instead of single items;
    - ``prefetch=K`` reads the next K samples on threads (default: 8 on remote stores such as ``s3://``,
      where every read is a round trip; 0 on local disks);
    - ``readahead`` (local stores, default on): the kernel reads about 192 MiB of the coming samples'
      bytes ahead while the current one decodes (hsstore.read.prefetch_reads).
    """

    def __init__(
        self,
        store: StoreArg,
        variant: str | None = None,
        layers: Sequence[int] | None = None,
        require: Required | None = None,
        allow_drift: Iterable[str] | str | None = (),
        seed: int = 0,
        shuffle: bool = True,
        batch_tokens: int | None = None,
        remainder: str = "keep",
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | None = None,
        raw: bool = False,
        readahead: bool = True,
        new_samples: str = "next_epoch",
    ) -> None:
        if remainder not in ("keep", "drop"):
            raise BadInput(f"remainder={remainder!r}; choose 'keep' or 'drop'")
        self.new_samples = check_join(new_samples)
        self._setup(store, variant, layers, require, allow_drift, raw)
        _check_settings(seed, shuffle, rank, world_size)
        self.seed, self.shuffle, self.batch_tokens, self.remainder = seed, shuffle, batch_tokens, remainder
        self._rank, self._world = (
            (None if rank is None else int(rank)),
            (None if world_size is None else int(world_size)),
        )
        if rank is not None and world_size is not None:
            self._world_and_rank()  # refused here, not at the first iteration
        self.prefetch, self.readahead = (
            (prefetch if prefetch is not None else 0 if self.reader.store.is_local else 8),
            readahead,
        )
        # collective under a process group, unless rank= and world_size= are given (a dataset of one rank's)
        self.reader, self.snapshot = agreed_snapshot(self.reader, rank is None and world_size is None)
        self.digest, self.unit_sizes, self.n = (
            snapshot_digest(self.snapshot),
            [c for _, c in self.snapshot],
            len(self.reader.keys),
        )
        self.live = LiveMarks(self.n)  # what DataLoader workers read when an iteration starts
        self._resumed: int | None = None
        self._warned_marks_of: int | None = None  # the epoch start (live.starts) whose mark_consumed warned

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # a spawned DataLoader worker has no process group: it keeps its parent's rank (what is not known yet,
            # as in a dataset made before the group and sent to the ranks, stays for the receiving process)
            state["_world"], state["_rank"] = self._world_and_rank()
        state.pop("_cuts_cache", None)  # every rank's batches: made again where needed, not shipped to each worker
        return state

    def __len__(self) -> int:
        """What iterating now yields on this rank, over all its DataLoader workers: the epoch's samples of its share
        not consumed yet, or with ``batch_tokens`` their batches; what ``len(DataLoader(ds, batch_size=None))``, and a
        learning-rate schedule sized from it, needs (with ``batch_size`` > 1 and several workers each worker batches
        its own items, so the loader's count is approximate; the store's samples: ``n``)."""
        runs = self._runs(1, 0)
        return len(runs) if self.batch_tokens else sum(len(r) for r in runs)

    @property
    def epoch(self) -> int:
        return self.live.epoch

    @property
    def consumed(self) -> np.ndarray:
        """bool [n]: the samples marked consumed in this epoch (by index into this snapshot's keys)."""
        return self.live.bits("marks")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (fresh marks). The epoch in progress goes on: after ``load_state_dict`` on every
        rank alike (a rank whose share of what is left is empty or done keeps the marks: starting the epoch
        again would split all of it while the others split the rest), an empty epoch, with a warning, once
        nothing of it is left (``for e in range(state["epoch"], E)`` then trains each sample once); otherwise
        while this rank's share has samples left (a fully consumed epoch starts again)."""
        epoch = int(epoch)
        if not 0 <= epoch < 2**62:
            raise BadInput(f"set_epoch({epoch}): an epoch is a count from 0")
        if self._resumed is not None and epoch < self._resumed:
            raise BadInput(
                f"set_epoch({epoch}) after load_state_dict of a state in epoch {self._resumed} would drop "
                f"the resume; call set_epoch({self._resumed}) (Accelerate: loader.set_epoch({self._resumed}))"
            )
        if epoch == self._resumed and not self._left_of_resumed():
            warnings.warn(
                f"set_epoch({epoch}): the loaded state's epoch {epoch} has nothing left to train (every sample "
                "consumed, or left for a later epoch by remainder='drop'): it yields nothing; "
                f"set_epoch({epoch + 1}) starts the next",
                stacklevel=2,
            )
        if epoch == self.epoch and (epoch == self._resumed or (~self.consumed[self._rank_seq()]).any()):
            self.live.replan()  # the workers share out what is left, in order
            self._warn_uneven_steps()
            return
        if self._resumed is not None and epoch > self._resumed and (left := self._left_of_resumed(mine=True)):
            warnings.warn(
                f"set_epoch({epoch}) after load_state_dict of a state in epoch {self._resumed}: its {left} "
                f"samples not yet consumed are skipped (set_epoch({self._resumed}) goes on with them; "
                "if they were trained and only their marks are late, nothing is lost)",
                stacklevel=2,
            )
        self._resumed = None
        self.live.start(epoch, np.zeros(self.n, dtype=bool))
        self._warn_uneven_steps()

    def _left_of_resumed(self, mine: bool = False) -> int:
        """Samples the ranks' runs of the loaded epoch hold that are not consumed (the state merged every rank's
        marks; ``mine``: this rank's run only, as the other ranks' marks since are not known here)."""
        (world, rank), consumed, order = self._world_and_rank(), self.consumed, self._epoch_order()
        return sum(int((~consumed[self._rank_split(r, order)]).sum()) for r in ([rank] if mine else range(world)))

    def mark_consumed(self, indices: Iterable[int] | torch.Tensor | Mapping[str, Any], epoch: Any = None) -> None:
        """Record samples the training loop has finished with (call in the main process): a batch or item
        (``mark_consumed(batch)``: its ``index``, and the ``epoch`` and ``epoch_start`` its items were read in), or
        indices with their ``epoch`` (an int, or one per index). Marks of items read before the epoch in progress
        started (set_epoch, load_state_dict) are left out, with a warning: a late mark of epoch e after
        set_epoch(e + 1), or of a pass a rollback discarded, would otherwise skip that sample now."""
        start = None
        if isinstance(indices, Mapping):
            if "index" not in indices:
                raise BadInput(
                    f"mark_consumed: the batch has no 'index' (it has {sorted(indices)}); pass a batch or "
                    "item of this dataset, or its indices"
                )
            batch = indices
            indices, start = batch["index"], batch.get("epoch_start")
            epoch = batch.get("epoch") if epoch is None else epoch
        idx = int_array(indices, "indices")
        self.live.check(idx)  # every index, also those left out below
        epochs = None if epoch is None else int_array(epoch, "epochs")
        here = np.ones(idx.shape, bool)
        for stamps, now in (
            (epochs, self.epoch),
            (None if start is None else int_array(start, "epoch starts"), self.live.starts),
        ):
            if stamps is not None:
                here &= same_stamp(stamps, now, idx.size)
        self.live.mark(idx[here])  # (before the warning: under warnings-as-errors the kept marks still count)
        if not here.all() and self._warned_marks_of != self.live.starts:
            self._warned_marks_of = self.live.starts  # once an epoch's start: a loop that marks late does so every step
            read_in = (
                ""
                if epochs is None
                else " (read in epoch {})".format(
                    ", ".join(str(e) for e in sorted(set(np.broadcast_to(epochs, idx.shape)[~here].tolist())))
                )
            )
            warnings.warn(
                f"mark_consumed: {int((~here).sum())} mark(s) left out: their items{read_in} were read before "
                f"the dataset started epoch {self.epoch} anew (set_epoch or load_state_dict); a sample counts in "
                "the pass that read it, not this one (later such marks are left out without a warning)",
                stacklevel=2,
            )

    def state_dict(self, gather: bool = True) -> dict[str, Any]:
        """Resumable state (JSON-ready, compact); with torch.distributed initialized (and ``gather``) it
        merges every rank's."""
        return save_state(self.epoch, self.seed, self.variant_id, self.snapshot, self.consumed, gather, self.shuffle)

    def load_state_dict(self, state: Mapping[str, Any], new_samples: str | None = None) -> None:
        """Resume ``state`` (state_dict()'s; anything else is one BadInput), by sample key when the store
        changed (class docstring); live workers follow at their next iteration."""
        join = check_join(new_samples or self.new_samples)
        saved = load_state(state, self.variant_id, self.n, self.seed, self.shuffle)
        same = saved.units is None or saved.digest == self.digest
        self.live.start(saved.epoch, saved.consumed if same else marks_by_key(self.reader, saved, join))
        self._resumed = saved.epoch

    def _world_and_rank(self) -> tuple[int, int]:
        """(world size, rank): as given, the rest from torch.distributed's process group. BadInput where one is given
        and the other cannot be known (every rank would take rank 0's share: half the data never trained), or the
        rank is not one of the world's."""
        grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
        world = self._world if self._world is not None else torch.distributed.get_world_size() if grouped else None
        rank = self._rank if self._rank is not None else torch.distributed.get_rank() if grouped else None
        if (world is None) != (rank is None):
            given = f"world_size={world}" if rank is None else f"rank={rank}"
            raise BadInput(
                f"StreamingHiddenStateDataset({given}) without {'rank' if rank is None else 'world_size'}= "
                "and no torch.distributed process group to tell it: pass both, or neither and initialize "
                "the process group first"
            )
        if grouped and self._world is not None and self._world > torch.distributed.get_world_size():
            raise BadInput(
                f"world_size={self._world} but the process group has {torch.distributed.get_world_size()} "
                f"ranks: the shares of ranks {torch.distributed.get_world_size()} to {self._world - 1} would "
                "never be read; pass the group's size (or leave world_size out)"
            )
        world, rank = int(world or 1), int(rank or 0)
        if not 0 <= rank < world:
            raise BadInput(f"rank={rank} is not one of world_size={world}'s ranks (0 to {world - 1})")
        return world, rank

    def _runs(self, workers: int | None = None, worker: int = 0) -> list[np.ndarray]:
        """This (rank, worker)'s unconsumed items (one run) or batches (a run each), in order (``workers``: of so
        many workers, default this DataLoader worker's). The split is fixed by marks the main process froze
        (``load_state_dict``, ``set_epoch``): later marks only drop samples (re-iterating without ``set_epoch``
        gets each once, the workers' turns possibly shifted)."""
        if workers is None:
            info = get_worker_info()
            workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        seq = self._rank_seq()
        lengths = self._lengths()[seq].tolist() if self.batch_tokens else None
        return worker_runs(seq, workers, worker, self.consumed, lengths, self.batch_tokens)

    def _lengths(self) -> np.ndarray:
        """Every sample's token count, by index (one array op: ``len()`` and each iteration ask for them)."""
        table = self.reader.table
        lengths: np.ndarray = table.spans[table.served_flat(), 1]
        return lengths

    def _rank_seq(self) -> np.ndarray:
        """This rank's samples of the epoch in order, as the split was fixed (consumed ones included)."""
        seq = self._rank_split(self._world_and_rank()[1])
        unplanned: np.ndarray = seq[~self.live.bits("plan")[seq]]  # (numpy types a fancy index as Any)
        return unplanned

    def _epoch_order(self) -> np.ndarray:
        """The epoch's order less the samples its split was fixed as consumed (a loaded state's marks)."""
        order = epoch_sequence(self.unit_sizes, self.seed, self.epoch, self.shuffle)
        kept: np.ndarray = order[~self.live.bits("base")[order]]
        return kept

    def _rank_split(self, rank: int, order: np.ndarray | None = None) -> np.ndarray:
        """Rank ``rank``'s part of the epoch (``order``: ``_epoch_order()``), as every rank computes it from the
        marks the split was fixed with."""
        order = self._epoch_order() if order is None else order
        world = self._world_and_rank()[0]
        if self.remainder == "drop" and 0 < len(order) < world and not self.live.bits("base").any():  # (a resume's
            # few samples left wait for a later epoch, as drop says; a whole epoch that feeds no rank is a mistake)
            raise BadInput(
                f"remainder='drop' over {world} ranks leaves every rank nothing of the {len(order)} samples "
                f"of epoch {self.epoch}; use remainder='keep' (ranks differ by at most one sample) or "
                "fewer ranks"
            )
        seq = split_for(order, world, rank, drop_remainder=self.remainder == "drop")
        if self.batch_tokens and self.remainder == "drop" and world > 1:
            seq = seq[: self._equal_batches(order, world)[rank]]
        return seq

    def _equal_batches(self, order: np.ndarray, world: int) -> list[int]:
        """Per rank, how many of its samples its first k batches hold, k the fewest batches any rank's run cuts
        into: with ``remainder="drop"`` every rank takes as many steps (a DDP rank with one batch more would wait
        in its gradients' all-reduce forever); the samples past them wait for a later epoch, as drop's do."""
        cuts = self._rank_cuts(order, world)
        fewest = min(len(c) for c in cuts)
        return [c[fewest - 1][1] if fewest else 0 for c in cuts]

    def _rank_cuts(self, order: np.ndarray, world: int) -> list[list[tuple[int, int]]]:
        """Every rank's batches (start, end into its run) of ``order``: once per epoch, split and remainder (kept
        until any changes; every rank computes the same)."""
        key = (
            self.epoch,
            world,
            self.batch_tokens,
            self.remainder,
            hashlib.sha1(self.live.t["base"].numpy().tobytes()).hexdigest(),
        )
        cached = self.__dict__.get("_cuts_cache")
        if cached is not None and cached[0] == key:
            cuts: list[list[tuple[int, int]]] = cached[1]
            return cuts
        lengths = self._lengths()
        drop = self.remainder == "drop"
        cuts = [
            token_batches(lengths[split_for(order, world, r, drop_remainder=drop)].tolist(), self.batch_tokens or 0)
            for r in range(world)
        ]
        self._cuts_cache = (key, cuts)
        return cuts

    def _warn_uneven_steps(self) -> None:
        """Once: a warning where ``remainder="keep"`` with ``batch_tokens`` gives the ranks of this epoch different
        numbers of batches (under DDP the rank with more waits in its gradients' all-reduce forever)."""
        world = self._world_and_rank()[0]
        if not self.batch_tokens or self.remainder != "keep" or world < 2 or self.__dict__.get("_warned_uneven"):
            return
        counts = sorted({len(c) for c in self._rank_cuts(self._epoch_order(), world)})
        if len(counts) > 1:
            self._warned_uneven = True
            warnings.warn(
                f"epoch {self.epoch}: with remainder='keep' and batch_tokens the {world} ranks take "
                f"{counts[0]} to {counts[-1]} batches; under DDP a rank with more batches waits in its "
                "gradients' all-reduce forever: use remainder='drop' (every rank as many batches) or "
                "torch.distributed.algorithms.Join",
                stacklevel=3,
            )

    def _check_not_spent(self) -> None:
        """BadInput when every sample of this rank's epoch is marked consumed since its split was fixed: iterating
        would silently train on nothing (a loop that marks samples but never calls set_epoch). (A loaded state with
        nothing left is an empty epoch: ``set_epoch`` warned.)"""
        seq = self._rank_seq()
        if len(seq) and self.consumed[seq].all():
            raise BadInput(
                f"epoch {self.epoch} is fully consumed (every sample of this rank is marked with "
                f"mark_consumed): call set_epoch({self.epoch + 1}) before iterating again"
            )

    def _items(self, indices: np.ndarray, epoch: int, start: int) -> Generator[dict[str, Any], None, None]:
        """Items of ``epoch`` (its ``start``-th start) in order, read ahead by the kernel (local, ``readahead``) and
        threads (``prefetch``)."""
        ahead = None
        if self.readahead and self.reader.store.is_local and len(indices):
            layers = sorted({i for ids in self.layer_roles.values() for i in ids})
            ahead = Readahead(self.reader, [self.reader.ref(int(i)) for i in indices], layers)
        try:
            for item in in_order(
                self._item, [int(i) for i in indices], self.prefetch, None if ahead is None else ahead.at
            ):
                item["epoch"], item["epoch_start"] = epoch, start
                yield item
        finally:
            if ahead is not None:
                ahead.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # each item carries the epoch and its start: mark_consumed(batch) tells a late mark of an earlier pass
        epoch, start = self.epoch, self.live.starts
        runs = self._runs()  # the epoch and marks are read here, when this iteration starts
        if not any(len(r) for r in runs):
            self._check_not_spent()
        items = self._items(np.concatenate(runs) if runs else np.zeros(0, np.int64), epoch, start)
        try:
            if not self.batch_tokens:
                yield from items
                return
            for run in runs:
                yield pad_collate([next(items) for _ in range(len(run))])
        finally:
            items.close()

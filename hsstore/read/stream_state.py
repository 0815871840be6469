"""The resumable state of a streaming dataset: what ``state_dict`` saves and ``load_state_dict`` checks (marks
by sample, tied to the committed snapshot's units and digest, carried over by key when the store changed), the
live marks a streaming dataset's DataLoader workers read from shared memory, and the indices and epoch stamps
``mark_consumed`` is given."""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.schema.store_records import CommitRecord
from hsstore.storage import commits, layout
from hsstore.storage.reader import VariantReader
from hsstore.storage.sample_table import Keys, SampleTable, unit_part

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
    """The committed set a dataset reads: its units (in the reader's order) and how many samples each serves."""
    text = "\n".join(f"{u}:{c}" for u, c in units)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pack_marks(bits: np.ndarray) -> str:
    """bool [n] -> the compact text a state holds."""
    return base64.b64encode(zlib.compress(np.packbits(bits).tobytes(), 6)).decode()


def _inflate(data: bytes, size: int) -> bytes:
    """The marks a state packed, never more than ``size`` bytes (a state is input: no zip bomb)."""
    d = zlib.decompressobj()
    raw = d.decompress(data, size)
    if d.unconsumed_tail or not d.eof or d.unused_data:
        raise ValueError("marks longer than the snapshot, or bytes after them")
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
        raise BadInput(
            f"state['format'] is {state['format']}; this hsstore writes format {FORMAT} (and reads the older "
            "states that carry no format field): resume with the hsstore that saved it"
        )
    return old


def _units(raw: list[Any]) -> list[tuple[str, int]]:
    if not all(
        isinstance(u, (list, tuple)) and len(u) == 2 and isinstance(u[0], str) and isinstance(u[1], int) for u in raw
    ):
        raise BadInput(f"state['units'] is not the [[unit id, samples], ...] list state_dict() writes; {FIX}")
    return [(u, int(c)) for u, c in raw]


def load_state(state: Mapping[str, Any], variant: str, n: int, seed: int, shuffle: bool = True) -> SavedState:
    """``state`` checked against this dataset (variant, seed, shuffle where the state records it; the old format
    also its sample count)."""
    old = _check_fields(state)
    if (state["variant"], state["seed"]) != (variant, seed):
        raise BadInput(
            f"state is for variant {state['variant']} with seed {state['seed']}; this dataset is "
            f"{variant} with seed {seed}"
        )
    if not isinstance(state.get("shuffle", shuffle), bool):
        raise BadInput(f"state['shuffle'] is {state['shuffle']!r}, not True or False; {FIX}")
    if state.get("shuffle", shuffle) != shuffle:  # (states saved before it was recorded carry none)
        raise BadInput(
            f"state was saved with shuffle={state['shuffle']}; this dataset has shuffle={shuffle}, so the "
            f"rest of the epoch would run in another order than the one it resumes: pass "
            f"shuffle={state['shuffle']}"
        )
    if old and state["n"] != n:
        raise BadInput(
            f"state is in the old format (marks by position, no snapshot) and was saved over "
            f"{state['n']} samples; the store serves {n} now, so its marks cannot be tied to samples: "
            "start the epoch over (set_epoch) or resume with a state saved by this hsstore"
        )
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


def agreed_snapshot(reader: VariantReader, collective: bool = True) -> tuple[VariantReader, list[tuple[str, int]]]:
    """The reader of the units rank 0 opened, and its snapshot, on every rank of an initialized process group
    (``collective``: every rank makes its dataset): ranks that opened a growing store moments apart read one
    snapshot, not each its own (each rank's share was cut from its own: samples went to two ranks or none, and the
    marks' gather failed on their sizes). BadInput where rank 0 opened another variant."""
    dist = torch.distributed
    if collective and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        held = [reader.id, list(reader.units)]
        dist.broadcast_object_list(held, src=0)  # (in memory, between the ranks: nothing of it is stored)
        if held[0] != reader.id:
            raise BadInput(
                f"rank {dist.get_rank()} opened variant {reader.id} but rank 0 opened {held[0]}: name the "
                "variant with one selector on every rank (a store that gained variants between the ranks' "
                "starts can make a selector name another)"
            )
        if held[1] != list(reader.units):
            reader = VariantReader(reader.store, reader.id, units=held[1])
    return reader, snapshot(reader)


def snapshot(reader: VariantReader) -> list[tuple[str, int]]:
    """(unit id, samples it serves) of the units ``reader`` reads, in the reader's order (commit order; a snapshot's own when it was given one)."""
    return reader.unit_counts()


def _check_same_snapshot(units: list[tuple[str, int]], n: int) -> None:
    """BadInput on every rank unless all ranks read one snapshot (their marks gather only then: a rank aborted)."""
    digest = int(snapshot_digest(units)[:15], 16)
    mine = torch.tensor([n, digest, -n, -digest], dtype=torch.int64)
    torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
    if int(mine[0]) != -int(mine[2]) or int(mine[1]) != -int(mine[3]):
        raise BadInput(
            f"the ranks read different snapshots of the store ({-int(mine[2])} to {int(mine[0])} samples): "
            "each cut its share from its own, so samples went to two ranks or none; make the dataset after "
            "init_process_group on every rank (it reads rank 0's snapshot), or open the store once it is "
            "complete"
        )


def save_state(
    epoch: int,
    seed: int,
    variant: str,
    units: list[tuple[str, int]],
    consumed: np.ndarray,
    gather: bool,
    shuffle: bool = True,
) -> dict[str, Any]:
    """The format-2 state; with torch.distributed initialized (and ``gather``) the marks of every rank."""
    if gather and torch.distributed.is_available() and torch.distributed.is_initialized():
        _check_same_snapshot(units, consumed.shape[0])
        t = torch.from_numpy(consumed.astype(np.uint8))
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        consumed = t.numpy().astype(bool)
    return {
        "format": FORMAT,
        "epoch": epoch,
        "seed": seed,
        "n": int(consumed.shape[0]),
        "variant": variant,
        "units": [[u, c] for u, c in units],
        "digest": snapshot_digest(units),
        "consumed": pack_marks(consumed),
        "shuffle": shuffle,
    }


def _saved_table(reader: VariantReader, units: list[str], epoch: int) -> SampleTable:
    """The samples of ``units`` (a saved snapshot's, in its order) from their commit records: committed, or taken
    back by ``verify --quarantine`` (their samples rebuilt since in other units). BadInput for a unit neither."""
    found = commits.scan(reader.io, reader.id, keep=unit_part).committed
    parts = []
    for u in units:
        raw = None if u in found else reader.io.get(layout.quarantine_key(reader.id, u))
        try:
            parts.append(found[u] if u in found else unit_part(CommitRecord.from_json(raw or b"", u, CorruptData)))
        except CorruptData:
            raise BadInput(
                f"the state was saved over unit {u} of variant {reader.id}, which is not committed now: "
                f"its marks cannot be tied to samples; start epoch {epoch + 1} with set_epoch"
            ) from None
    return SampleTable(parts)


def marks_by_key(reader: VariantReader, saved: SavedState, join: str) -> np.ndarray:
    """A state saved over another snapshot, as marks over ``reader``'s: its consumed samples by key, and
    (``join="next_epoch"``) the samples it did not know, held back to the next epoch. BadInput when a
    unit it names is not committed now or serves other samples."""
    then = _saved_table(reader, [u for u, _ in saved.units or []], saved.epoch)
    if snapshot_digest(then.unit_counts()) != saved.digest:
        raise BadInput(
            f"the units the state names serve other samples than when it was saved (digest "
            f"{saved.digest}): its marks cannot be tied to samples; start epoch {saved.epoch + 1} with set_epoch"
        )
    index = {k: i for i, k in enumerate(reader.keys)}
    then_keys = list(Keys(then))
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
        # [epoch, starts: how many times an epoch was started (set_epoch, load_state_dict); items carry it]
        self.ctl: torch.Tensor = torch.zeros(2, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self.t: dict[str, torch.Tensor] = {
            name: torch.zeros(size, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
            for name in ("base", "plan", "marks")
        }

    @property
    def epoch(self) -> int:
        return int(self.ctl[0])

    @property
    def starts(self) -> int:
        return int(self.ctl[1])

    def bits(self, name: str) -> np.ndarray:
        return np.unpackbits(self.t[name].numpy())[: self.n].astype(bool)

    def start(self, epoch: int, marks: np.ndarray) -> None:
        """Epoch ``epoch`` with ``marks`` (bool [n]) consumed; the split is fixed with them."""
        packed = np.zeros(self.t["marks"].shape[0], np.uint8)
        packed[: (self.n + 7) // 8] = np.packbits(marks)
        for t in self.t.values():
            t.numpy()[:] = packed
        self.ctl[0] = epoch
        self.ctl[1] += 1

    def replan(self) -> None:
        """This rank's workers share out what is left of its run (the marks made so far are a prefix)."""
        self.t["plan"].numpy()[:] = self.t["marks"].numpy()

    def check(self, idx: np.ndarray) -> None:
        """BadInput naming an index that is not one of the ``n`` samples."""
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            bad = int(idx.max() if idx.max() >= self.n else idx.min())
            raise BadInput(
                f"mark_consumed: index {bad} is not one of this dataset's {self.n} samples; pass the batch (or its 'index')"
            )

    def mark(self, idx: np.ndarray) -> None:
        """Mark ``idx`` consumed (``check``ed by the caller)."""
        np.bitwise_or.at(self.t["marks"].numpy(), idx >> 3, (128 >> (idx & 7)).astype(np.uint8))


# --- What mark_consumed is given: indices and the epoch stamps their items carry


def int_array(x: Any, what: str) -> np.ndarray:
    """Indices or epochs (an int, a sequence, an array or tensor of integers) as a flat int64 array; BadInput
    for anything else (floats, bools, text, items)."""
    try:
        arr = np.asarray(x.tolist() if isinstance(x, torch.Tensor) else x)
    except ValueError:  # (ragged nesting)
        arr = np.asarray(None)
    if arr.dtype.kind not in "iu" and arr.size:
        raise BadInput(
            f"mark_consumed: {what} must be whole numbers (an int, a list, an array or tensor of them), not "
            f"{type(x).__name__} of {arr.dtype}; pass the batch, or batch['index']"
        )
    return arr.astype(np.int64).ravel()


def same_stamp(stamps: np.ndarray, now: int, n: int) -> np.ndarray:
    """bool [n]: which of ``n`` marks carry the stamp ``now`` (``stamps``: one for all, or one each)."""
    if stamps.size not in (1, n):
        raise BadInput(
            f"mark_consumed: {n} indices and {stamps.size} epochs; pass one epoch, or one per index (a batch's 'epoch')"
        )
    same: np.ndarray = np.broadcast_to(stamps == now, (n,))
    return same

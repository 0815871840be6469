"""A variant's committed samples as a few flat arrays, the index a reader opens with.

A reader of millions of samples holds no Python object per sample: keys are one fixed-width bytes array
(32 bytes a sample key), offsets and lengths one int64 array, the unit of each sample one int32 array,
and a stable argsort of the keys finds a key by binary search. ``SampleRef`` objects, key strings and a
unit's commit record with its sample list are made only when asked for. Each commit record is reduced
to its arrays as it is read (hsstore.storage.commits.scan's ``keep``), so the per-sample objects JSON
decoding makes live for one unit at a time.

Which sample is served is the rule readers have: units in commit order (hsstore.storage.reader.commit_order:
by id before that was recorded), samples in record order, and the first unit to hold a key wins (racing writers
never show a key twice).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

import msgspec
import numpy as np

from hsstore.core.schema.store_records import CommitRecord


@dataclass(frozen=True)
class SampleRef:
    """Where one committed sample lives: its unit and the token range inside it."""

    key: str
    unit: str
    offset: int
    length: int


class UnitPart(NamedTuple):
    """One commit record reduced: the record without its sample list, and the samples as arrays."""

    header: CommitRecord
    keys: np.ndarray  # fixed-width bytes, or objects (str) for keys bytes cannot hold exactly
    spans: np.ndarray  # int64 [n, 2]: offset, length


def unit_part(rec: CommitRecord) -> UnitPart:
    """``rec`` as a UnitPart (what a reader keeps of each commit record it reads: ``rec`` itself is given
    up, its sample list emptied in place rather than copied, which would check its files again)."""
    keys, offsets, lengths = zip(*rec.samples) if rec.samples else ((), (), ())
    spans = np.column_stack([np.array(offsets, dtype=np.int64), np.array(lengths, dtype=np.int64)])
    msgspec.structs.force_setattr(rec, "samples", [])
    return UnitPart(rec, _key_array(list(keys)), spans.reshape(-1, 2))


def _key_array(keys: list[str]) -> np.ndarray:
    """Keys as fixed-width bytes; as objects where bytes would not give each key back exactly (a key
    that is not ASCII or holds a NUL: never a sample key hsstore makes, but a record may say so)."""
    if "\x00" not in "".join(keys):
        try:
            return np.array(keys, dtype=np.bytes_) if keys else np.zeros(0, "S1")
        except UnicodeEncodeError:
            pass
    return np.array(keys, dtype=object)


def _concat_keys(parts: list[np.ndarray]) -> np.ndarray:
    if any(p.dtype == object for p in parts):  # one kind for all: str objects
        parts = [p if p.dtype == object else np.char.decode(p, "ascii").astype(object) for p in parts]
    return np.concatenate(parts) if parts else np.zeros(0, "S1")


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _fold(keys: np.ndarray) -> np.ndarray | None:
    """A uint64 hash of each fixed-width key (equal keys, equal hashes); None for object keys."""
    if keys.dtype == object:
        return None
    w = keys.dtype.itemsize
    b = keys.view(np.uint8).reshape(len(keys), w)
    if w % 8:
        b = np.concatenate([b, np.zeros((len(keys), 8 - w % 8), np.uint8)], axis=1)
    cols = np.ascontiguousarray(b).view(np.uint64)
    h = np.zeros(len(keys), np.uint64)
    for j in range(cols.shape[1]):
        h = (h ^ cols[:, j]) * _MIX
    return h


def _first_of_each(keys: np.ndarray) -> tuple[np.ndarray | None, int]:
    """(flat positions of the first of each distinct key, in order, or None when no key repeats; how many
    keys repeat). Keys of distinct hashes differ, so only keys sharing a hash are compared."""
    h = _fold(keys)
    if h is None:
        cand = np.arange(len(keys))
    else:
        ranked = np.sort(h)
        shared = ranked[1:][ranked[1:] == ranked[:-1]]
        if not len(shared):
            return None, 0
        cand = np.flatnonzero(np.isin(h, shared))
    sub = keys[cand]
    order = np.argsort(sub, kind="stable")  # equal keys stay in flat order: the first is served
    ranked_keys = sub[order]
    dup = ranked_keys[1:] == ranked_keys[:-1]
    if not dup.any():
        return None, 0
    keep = np.ones(len(keys), dtype=bool)
    keep[cand[order[1:][dup]]] = False
    return np.flatnonzero(keep), int(np.count_nonzero(dup & ~np.concatenate([[False], dup[:-1]])))


class SampleTable:
    """The samples of a reader's units (UnitParts in the reader's order), flat, with the served ones chosen."""

    def __init__(self, parts: list[UnitPart]) -> None:
        self.headers = [p.header for p in parts]
        self.uid_index = {h.unit: i for i, h in enumerate(self.headers)}
        counts = np.array([len(p.keys) for p in parts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.all_keys = _concat_keys([p.keys for p in parts])
        self.spans = np.concatenate([p.spans for p in parts]) if parts else np.zeros((0, 2), np.int64)
        self.unit_of = np.repeat(np.arange(len(parts), dtype=np.int32), counts)
        self.served, self.duplicated_keys = _first_of_each(self.all_keys)  # served: None when all are
        self._index: tuple[np.ndarray, np.ndarray] | None = None  # (sorted hashes or keys, order): on first find

    def __len__(self) -> int:
        return len(self.all_keys) if self.served is None else len(self.served)

    def _flat(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index {i} is out of range for {len(self)} samples")
        i %= len(self)
        return i if self.served is None else int(self.served[i])

    def _key(self, a: int) -> str:
        k = self.all_keys[a]
        return k if isinstance(k, str) else k.decode("ascii")

    def _ref(self, a: int) -> SampleRef:
        off, n = self.spans[a].tolist()
        return SampleRef(self._key(a), self.headers[self.unit_of[a]].unit, off, n)

    def ref(self, i: int) -> SampleRef:
        """The ``i``-th served sample."""
        return self._ref(self._flat(i))

    def key(self, i: int) -> str:
        return self._key(self._flat(i))

    def find(self, key: str) -> int | None:
        """The flat position of the served sample ``key`` (None if no unit holds it): a binary search in
        the keys' hashes (sorted on the first lookup by key), then the keys of equal hash compared."""
        keys = self.all_keys
        if not isinstance(key, str):
            return None
        want: str | bytes = key
        if keys.dtype != object:
            if not key.isascii() or len(key) > keys.dtype.itemsize:
                return None
            want = key.encode("ascii")
        if self._index is None:
            h = _fold(keys)
            order = np.argsort(keys if h is None else h, kind="stable")  # equal keys stay in unit order
            self._index = ((keys if h is None else h)[order], order)
        ranked, order = self._index
        probe = np.array([want], dtype=keys.dtype)
        folded = _fold(probe)  # None for object keys, compared as they are
        probe = probe if folded is None else folded
        for j in range(int(np.searchsorted(ranked, probe[0], "left")), int(np.searchsorted(ranked, probe[0], "right"))):
            if keys[order[j]] == want:
                return int(order[j])  # the first of equal keys: the served one
        return None

    def served_flat(self) -> np.ndarray:
        return np.arange(len(self.all_keys)) if self.served is None else self.served

    def n_tokens(self) -> int:
        return int(self.spans[self.served_flat(), 1].sum()) if len(self) else 0

    def unit_sizes(self) -> list[int]:
        """Served samples of each unit that serves any, in unit order."""
        counts = np.bincount(self.unit_of[self.served_flat()], minlength=len(self.headers))
        return [int(c) for c in counts if c]

    def unit_counts(self) -> list[tuple[str, int]]:
        """(unit id, served samples) of each unit that serves any, in unit order."""
        counts = np.bincount(self.unit_of[self.served_flat()], minlength=len(self.headers))
        return [(self.headers[u].unit, int(c)) for u, c in enumerate(counts) if c]

    def unit_tokens(self, uid: str) -> int:
        u = self.uid_index[uid]
        return int(self.spans[self.starts[u] : self.starts[u + 1], 1].sum())

    def unit_refs(self, uid: str) -> list[SampleRef]:
        """The served samples of unit ``uid``, in record order."""
        u = self.uid_index[uid]
        a, b = int(self.starts[u]), int(self.starts[u + 1])
        flat = (
            range(a, b)
            if self.served is None
            else self.served[np.searchsorted(self.served, a) : np.searchsorted(self.served, b)].tolist()
        )
        return [self._ref(x) for x in flat]

    def record(self, uid: str) -> CommitRecord:
        """Unit ``uid``'s commit record as read, its sample list made again from the arrays."""
        u = self.uid_index[uid]
        a, b = int(self.starts[u]), int(self.starts[u + 1])
        keys = [self._key(x) for x in range(a, b)]
        rec = copy.copy(self.headers[u])
        msgspec.structs.force_setattr(rec, "samples", [(k, o, n) for k, (o, n) in zip(keys, self.spans[a:b].tolist())])
        return rec


class Keys(Sequence[str]):
    """The served keys in reader order (strings made as they are read)."""

    def __init__(self, table: SampleTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.table.key(j) for j in range(*i.indices(len(self)))]
        return self.table.key(i.__index__())

    def __iter__(self) -> Iterator[str]:
        flat, keys = self.table.served_flat(), self.table.all_keys
        for a in range(0, len(flat), 1 << 16):
            for k in keys[flat[a : a + (1 << 16)]].tolist():
                yield k if isinstance(k, str) else k.decode("ascii")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.table.find(key) is not None

    def __eq__(self, other: object) -> bool:  # as the list it was: equal to a list or tuple of the same keys
        if isinstance(other, (Keys, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Keys({list(self[:3])}{', ...' if len(self) > 3 else ''}; {len(self)} keys)"


class Refs(Mapping[str, SampleRef]):
    """key -> SampleRef of each served sample (made on lookup); iterates in reader order."""

    def __init__(self, table: SampleTable, vid: str) -> None:
        self.table, self.vid = table, vid

    def __getitem__(self, key: str) -> SampleRef:
        a = self.table.find(key)
        if a is None:
            raise KeyError(f"sample {key!r} is not committed in variant {self.vid}")
        return self.table._ref(a)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.table.find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(Keys(self.table))

    def __len__(self) -> int:
        return len(self.table)


class UnitRecords(Mapping[str, CommitRecord]):
    """uid -> the unit's commit record (its sample list made on each lookup), in the reader's order."""

    def __init__(self, table: SampleTable) -> None:
        self.table = table

    def __getitem__(self, uid: str) -> CommitRecord:
        if uid not in self.table.uid_index:
            raise KeyError(uid)
        return self.table.record(uid)

    def __iter__(self) -> Iterator[str]:
        return (h.unit for h in self.table.headers)

    def __len__(self) -> int:
        return len(self.table.headers)

    def records(self) -> Sequence[CommitRecord]:
        return _Records(self)


class _Records(Sequence[CommitRecord]):
    def __init__(self, units: UnitRecords) -> None:
        self.units = units

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        heads = self.units.table.headers[i]
        return [self.units[h.unit] for h in heads] if isinstance(i, slice) else self.units[heads.unit]

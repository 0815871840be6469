"""The storage seam: one interface for a store's bytes, chosen once when a store opens.

Everything above this (store, reader, writer, verify, gc) asks a ``Backend`` for objects by key and
never asks which kind it is. Two implementations: ``LocalBackend`` (hsstore.storage.local: a directory,
``pwrite``/``pread`` with checked writes, no symlink ever followed) and ``ZarrBackend``
(hsstore.storage.remote: any zarr v3 store, e.g. fsspec URLs such as ``s3://`` or ``memory://``).
Keys are built by hsstore.storage.layout. One conformance suite (tests/storage/test_backend_conformance.py)
runs against each.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import xxhash
from crc32c import crc32c as crc32c_of

from hsstore.storage.fileio import Written
from hsstore.storage.leases import Lease

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from hsstore.core.schema.store_records import ChecksumKind

# what an Entry is: Entry.kind
EntryKind = Literal["file", "dir", "symlink", "fifo", "socket", "device", "other"]


@dataclass(frozen=True)
class Entry:
    """One entry of a store's tree: its key and what it is (``file``, ``dir``, ``symlink``, ``fifo``,
    ``socket``, ``device``, ``other``); ``executable`` for a file with an execute bit."""

    key: str
    kind: EntryKind
    executable: bool = False


class RangeSource(ABC):
    """Byte ranges of one object (a shard): what the direct shard reader reads through. ``coalesce``:
    each read is a round trip (an object store), so a reader fetches neighbouring chunks in one read."""

    size: int
    coalesce: bool = False

    @abstractmethod
    def read(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end of the object)."""

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        """Fill ``views`` in order from ``offset``; returns the bytes placed."""
        data = self.read(offset, sum(v.nbytes for v in views))
        pos = 0
        for v in views:
            part = data[pos : pos + v.nbytes]
            v[: len(part)] = part
            pos += len(part)
        return pos

    def cached(self, offset: int, n: int) -> bool:
        """Whether ``[offset, offset + n)`` looks in memory already (a hint; False where it cannot tell)."""
        return False

    def will_need(self, offset: int, n: int) -> None:  # noqa: B027 - most sources cannot read ahead
        """Start reading ``[offset, offset + n)`` in the background (a hint: local files ask the kernel)."""

    def checksum(self, kind: ChecksumKind) -> str:
        """The ``kind`` checksum of the whole object (xxh3: 16 hex digits; crc32c: 8), read in 8 MiB blocks."""
        h, crc, off = xxhash.xxh3_64(), 0, 0
        while off < self.size and (block := self.read(off, min(1 << 23, self.size - off))):
            if kind == "xxh3":
                h.update(block)
            else:
                crc = crc32c_of(block, crc)
            off += len(block)
        return h.hexdigest() if kind == "xxh3" else f"{crc:08x}"

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the source holds."""


class BufferRange(RangeSource):
    """Bytes already fetched, standing for the object range ``[base, base + len(data))``."""

    def __init__(self, data: bytes | bytearray, base: int, n: int | None = None) -> None:
        """``n``: the first ``n`` bytes of ``data`` (a reused buffer may be longer)."""
        self.data, self.base = data, base
        self.size = base + (len(data) if n is None else n)

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.view(offset, n))

    def view(self, offset: int, n: int) -> memoryview:
        """Up to ``n`` bytes at ``offset``, without a copy."""
        if offset < self.base:
            return memoryview(b"")
        return memoryview(self.data)[offset - self.base : min(offset + n, self.size) - self.base]

    def covers(self, offset: int, n: int) -> bool:
        return self.base <= offset and offset + n <= self.size

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        """Fill ``views`` in order from ``offset``, one copy each (no intermediate bytes)."""
        got = 0
        for v in views:
            part = self.view(offset + got, v.nbytes)
            v[: len(part)] = part
            got += len(part)
        return got


class Backend(ABC):
    """A store's bytes: whole objects by key, shards by range, listing, sizes, removal."""

    location: str
    is_local: bool = False

    @abstractmethod
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        """The object's bytes (None if absent); CorruptData if it is larger than ``cap`` or not a plain
        object (a symlink, FIFO or device on a local disk)."""

    @abstractmethod
    def put(self, key: str, parts: Sequence[Buffer]) -> Written:
        """Write a new object from buffers in order, every byte checked (not atomic: for the files of a
        unit, which no reader looks at before its commit). WriteFailed on any failure."""

    @abstractmethod
    def put_atomic(self, key: str, data: bytes) -> None:
        """Write or replace an object so a reader sees the old bytes or the new, never part."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if nothing is there yet; True if this call wrote it."""

    def claim(self, key: str, data: bytes) -> Lease | None:
        """Write a unit's writer record ``key`` (``units/<uid>/zarr.json``) if the unit does not exist yet,
        as the unit's first file, and hold the unit's lease until the returned Lease is released (None if
        the unit exists). Here, without locks: ``put_if_absent``; gc judges by the record's pid and age."""
        return Lease() if self.put_if_absent(key, data) else None

    def lease_if_free(self, key: str) -> Lease | None:
        """The lease of the unit whose writer record is ``key`` if no live writer holds it, else None.
        Here, without locks: always an empty lease."""
        return Lease()

    @abstractmethod
    def open_range(self, key: str) -> RangeSource:
        """A reader of byte ranges of the object (FileNotFoundError if absent)."""

    @abstractmethod
    def list(self, prefix: str) -> builtins.list[str]:
        """Keys under ``prefix``, recursively, temporary files excluded, sorted."""

    @abstractmethod
    def list_dir(self, prefix: str) -> builtins.list[str]:
        """Names of the immediate children of ``prefix`` (objects and sub-prefixes), sorted."""

    @abstractmethod
    def entries(self) -> Iterator[Entry]:
        """Every entry of the store (directories and special files too, where a back end has them)."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes (None if absent)."""

    @abstractmethod
    def checksum(self, key: str, kind: ChecksumKind) -> str | None:
        """The ``kind`` checksum of the object's bytes (``ByteSource.checksum``; None if absent)."""

    @abstractmethod
    def remove_tree(self, prefix: str) -> int:
        """Remove every object under ``prefix`` (never anything outside the store); returns how many."""

    @abstractmethod
    def remove(self, key: str) -> None:
        """Remove one object (absent is fine)."""

    @abstractmethod
    def temp_files(self) -> builtins.list[tuple[str, float]]:
        """Temporary objects of atomic puts (locally also unit folders whose claim never finished), with
        their age in seconds."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

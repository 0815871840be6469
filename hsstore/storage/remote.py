"""The zarr/fsspec back end: a store behind any zarr v3 ``Store`` (``s3://...`` and other fsspec URLs,
``memory://``). A single PUT is all-or-nothing on object stores, so atomic puts need no temp objects;
every put is confirmed by the size the store reports afterwards; reads of metadata are capped by a
ranged GET; shards are read by byte range."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from zarr.abc.store import RangeByteRequest
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore

from hsstore.core.errors import CorruptData, HsstoreError, WriteFailed
from hsstore.storage.backend import Backend, Entry, RangeSource
from hsstore.storage.fileio import Written, digest
from hsstore.storage.layout import TMP_PREFIX
from hsstore.storage.records import MAX_RECORD_BYTES


@contextmanager
def reading(key: str, location: str) -> Iterator[None]:
    """A back end's failure to read as one line (absence stays FileNotFoundError)."""
    try:
        yield
    except (FileNotFoundError, HsstoreError):
        raise
    except Exception as e:  # noqa: BLE001 - any client's error (network, permissions), named in one line
        raise CorruptData(f"reading {key or 'the store'} from {location} failed: {type(e).__name__}: {e}") from None


class ZarrRange(RangeSource):
    """Ranged GETs of one object."""

    coalesce = True
    def __init__(self, backend: ZarrBackend, key: str, size: int) -> None:
        self.backend, self.key, self.size = backend, key, size

    def read(self, offset: int, n: int) -> bytes:
        if n <= 0 or offset >= self.size:
            return b""
        return self.backend.get_range(self.key, offset, min(n, self.size - offset)) or b""


class ZarrBackend(Backend):
    """A store behind a zarr v3 store object."""

    def __init__(self, zstore: ZarrStore, location: str) -> None:
        self.zstore = zstore
        self.location = location

    @classmethod
    def from_url(cls, url: str, read_only: bool) -> ZarrBackend:
        # no listing cache: with several writers a cached listing hides their commits
        try:
            zstore = FsspecStore.from_url(url, read_only=read_only, storage_options={"use_listings_cache": False})
        except TypeError:  # a filesystem that takes no such option (e.g. memory://)
            zstore = FsspecStore.from_url(url, read_only=read_only)
        return cls(zstore, url)

    def get(self, key: str, cap: int | None = None) -> bytes | None:
        cap = MAX_RECORD_BYTES if cap is None else cap
        data = self.get_range(key, 0, cap + 1)
        if data is not None and len(data) > cap:
            raise CorruptData(f"{key} holds more than the {cap} bytes a record of this kind may hold")
        return data

    def get_range(self, key: str, offset: int, n: int) -> bytes | None:
        with reading(key, self.location):
            buf = sync(self.zstore.get(key, prototype=default_buffer_prototype(),
                                       byte_range=RangeByteRequest(offset, offset + n)))
        return None if buf is None else buf.to_bytes()

    def put(self, key: str, parts: Sequence[Any]) -> Written:
        want = digest(parts)
        data = b"".join(p if isinstance(p, bytes) else bytes(p) for p in parts)
        try:
            sync(self.zstore.set(key, default_buffer_prototype().buffer.from_bytes(data)))
            got = self.size(key)
        except Exception as e:  # noqa: BLE001 - any back end's failure, named in one line
            raise WriteFailed(f"writing {key} to {self.location} failed: {type(e).__name__}: {e}") from None
        if got != want.size:
            raise WriteFailed(f"writing {key} failed: the store holds {got} bytes after a put of {want.size}")
        return want

    def put_atomic(self, key: str, data: bytes) -> None:
        self.put(key, [data])

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.exists(key):
            return False
        self.put(key, [data])
        return True

    def open_range(self, key: str) -> ZarrRange:
        size = self.size(key)
        if size is None:
            raise FileNotFoundError(key)
        return ZarrRange(self, key, size)

    def list(self, prefix: str) -> list[str]:
        async def collect() -> list[str]:
            return [k async for k in self.zstore.list_prefix(prefix)]

        with reading(prefix, self.location):
            keys = sync(collect())
        return sorted(k for k in keys if not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX))

    def list_dir(self, prefix: str) -> list[str]:
        async def collect() -> list[str]:
            return [k async for k in self.zstore.list_dir(prefix.rstrip("/") + "/" if prefix else "")]

        with reading(prefix, self.location):
            return sorted(k.rstrip("/") for k in sync(collect()))

    def entries(self) -> Iterator[Entry]:
        for key in self.list(""):
            yield Entry(key, "file")

    def size(self, key: str) -> int | None:
        with reading(key, self.location):
            if not sync(self.zstore.exists(key)):
                return None
            return int(sync(self.zstore.getsize(key)))

    def crc32c(self, key: str) -> str | None:
        try:
            return self.open_range(key).crc32c()
        except FileNotFoundError:
            return None

    def remove_tree(self, prefix: str) -> int:
        keys = self.list(prefix.rstrip("/") + "/")
        for k in keys:
            sync(self.zstore.delete(k))
        return len(keys)

    def remove(self, key: str) -> None:
        sync(self.zstore.delete(key))

    def temp_files(self) -> list[tuple[str, float]]:
        return []  # puts here are single PUTs: no temporary objects

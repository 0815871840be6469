"""The zarr/fsspec back end: a store behind any zarr v3 ``Store`` (``s3://...`` and other fsspec URLs,
``memory://``). A single PUT is all-or-nothing on object stores, so atomic puts need no temp objects;
every put is confirmed by the size the store reports afterwards; reads of metadata are capped by a
ranged GET; shards are read by byte range."""

from __future__ import annotations

import builtins
import errno
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from zarr.abc.store import RangeByteRequest
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore

from hsstore.core.errors import CorruptData, HsstoreError, StoreGone, StoreUnreachable, WriteFailed, write_cause
from hsstore.storage.backend import Backend, Entry, RangeSource
from hsstore.storage.fileio import MAX_RECORD_BYTES, Written, digest
from hsstore.storage.layout import TMP_PREFIX

if TYPE_CHECKING:
    from typing_extensions import Buffer
    from zarr.core.buffer import Buffer as ZarrBuffer

    from hsstore.core.schema.store_records import ChecksumKind

T = TypeVar("T")
ATTEMPTS = 4  # tries of one request that fails on the network (botocore is told to try once: see _client_options)
BACKOFF_SECONDS = 0.25  # before the second try; doubled before each further one
# clients' names for a connection that failed, dropped or timed out (aiohttp, botocore, urllib3, requests)
_NETWORK_NAMES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ClientConnectionError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "ProxyConnectionError",
        "IncompleteRead",
        "ProtocolError",
        "ConnectionError",
        "Timeout",
        "ReadTimeout",
        "ConnectTimeout",
        "ResponseStreamingError",
    }
)
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EPIPE,
    }
)


def is_network_error(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) says the connection failed, not the data."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (ConnectionError, TimeoutError)) or type(cur).__name__ in _NETWORK_NAMES:
            return True
        if isinstance(cur, OSError) and cur.errno in _NETWORK_ERRNOS:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def unreachable(what: str, location: str, e: BaseException) -> StoreUnreachable:
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return StoreUnreachable(
        f"{location} did not answer {what} after {ATTEMPTS} tries ({type(e).__name__}: {first}); "
        "the data is not known to be damaged — check the network or the server and re-run"
    )


def with_retries(fn: Callable[[], T], what: str, location: str) -> T:
    """``fn()`` retried with backoff while it fails on the network; then StoreUnreachable (exit 1)."""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except FileNotFoundError as e:
            if write_cause(e) == "no_bucket":  # the bucket, not a key, is missing: no key can be read or written
                raise StoreGone(
                    f"{what} in {location} failed: its bucket does not exist (deleted, or a typo in the "
                    "URL); create the bucket or choose another store, then re-run"
                ) from None
            raise
        except HsstoreError:
            raise
        except Exception as e:  # noqa: BLE001 - sorted below: the network, or anything else
            if not is_network_error(e):
                raise
            if attempt + 1 == ATTEMPTS:
                raise unreachable(what, location, e) from None
            time.sleep(BACKOFF_SECONDS * 2**attempt)
    raise AssertionError("unreachable")


@contextmanager
def reading(key: str, location: str) -> Iterator[None]:
    """A back end's failure to read as one line (absence stays FileNotFoundError; the network failing is
    StoreUnreachable, raised by with_retries, never CorruptData)."""
    try:
        yield
    except (FileNotFoundError, HsstoreError):
        raise
    except Exception as e:  # noqa: BLE001 - any client's error (permissions, a refusal), named in one line
        if is_network_error(e):
            raise unreachable(f"reading {key or 'the store'}", location, e) from None
        raise CorruptData(f"reading {key or 'the store'} from {location} failed: {type(e).__name__}: {e}") from None


def _client_options(url: str) -> dict[str, Any]:
    """botocore retries a refused connection for seconds inside each request: a few quick tries there
    (throttling is still retried by s3fs), so with_retries bounds how long a dead server takes to report."""
    if url.startswith(("s3://", "s3a://")):
        return {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    return {}


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
            zstore = FsspecStore.from_url(
                url, read_only=read_only, storage_options={"use_listings_cache": False, **_client_options(url)}
            )
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
        def get() -> ZarrBuffer | None:
            return sync(
                self.zstore.get(
                    key, prototype=default_buffer_prototype(), byte_range=RangeByteRequest(offset, offset + n)
                )
            )

        with reading(key, self.location):
            buf = with_retries(get, f"reading {key}", self.location)
        return None if buf is None else buf.to_bytes()

    def put(self, key: str, parts: Sequence[Buffer]) -> Written:
        want = digest(parts)
        data = b"".join(p if isinstance(p, bytes) else bytes(p) for p in parts)
        try:  # a PUT of the same bytes is idempotent: retried like a read while the network fails
            with_retries(
                lambda: sync(self.zstore.set(key, default_buffer_prototype().buffer.from_bytes(data))),
                f"writing {key}",
                self.location,
            )
            got = self.size(key)
        except StoreUnreachable:
            raise
        except Exception as e:  # noqa: BLE001 - any back end's failure, named in one line, with its cause
            why = "its bucket does not exist" if isinstance(e, StoreGone) else f"{type(e).__name__}: {e}"
            raise WriteFailed(f"writing {key} to {self.location} failed: {why}", write_cause(e)) from None
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

    def list(self, prefix: str) -> builtins.list[str]:
        async def collect() -> list[str]:
            return [k async for k in self.zstore.list_prefix(prefix)]

        with reading(prefix, self.location):
            keys = with_retries(lambda: sync(collect()), f"listing {prefix or 'the store'}", self.location)
        return sorted(k for k in keys if not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        async def collect() -> list[str]:
            return [k async for k in self.zstore.list_dir(prefix.rstrip("/") + "/" if prefix else "")]

        with reading(prefix, self.location):
            found = with_retries(lambda: sync(collect()), f"listing {prefix or 'the store'}", self.location)
        return sorted(k.rstrip("/") for k in found)

    def entries(self) -> Iterator[Entry]:
        for key in self.list(""):
            yield Entry(key, "file")

    def size(self, key: str) -> int | None:
        def size() -> int | None:
            return int(sync(self.zstore.getsize(key))) if sync(self.zstore.exists(key)) else None

        with reading(key, self.location):
            return with_retries(size, f"reading the size of {key}", self.location)

    def checksum(self, key: str, kind: ChecksumKind) -> str | None:
        try:
            return self.open_range(key).checksum(kind)
        except FileNotFoundError:
            return None

    def remove_tree(self, prefix: str) -> int:
        keys = self.list(prefix.rstrip("/") + "/")
        for k in keys:
            sync(self.zstore.delete(k))
        return len(keys)

    def remove(self, key: str) -> None:
        sync(self.zstore.delete(key))

    def temp_files(self) -> builtins.list[tuple[str, float]]:
        return []  # puts here are single PUTs: no temporary objects

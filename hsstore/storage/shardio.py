"""Direct I/O of hsstore's zarr v3 arrays: the hot path of building and reading, same bytes as zarr.

hsstore stores each unit's arrays as one zarr ``sharding_indexed`` shard (inner chunks of ``c`` rows,
codecs ``bytes(little) -> [compressor] -> crc32c``, index ``bytes -> crc32c`` at the end). zarr-python
reads and writes that format through a general async pipeline that costs milliseconds per call; this
module writes and reads exactly the same bytes with one codec call per chunk, checking every crc32c,
through any back end (a local file by ``pread``, an object store by ranged GETs). A reader checks each
chunk's crc32c on its first read; a chunk holding many samples (small hidden sizes) is then served from
memory (compressed: ``DECODED``) or, uncompressed, by reading just the rows asked for. Any zarr v3 reader
opens what it writes (a test checks both ways). Format 1.0 token arrays (one plain chunk,
``bytes -> crc32c``) are read here too.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c
import numpy as np

from hsstore.core.batching import physical_memory
from hsstore.core.errors import CorruptData
from hsstore.core.interrupt import ForkSafeLock
from hsstore.core.outputs import byte_size
from hsstore.core.schema.store_records import ArrayMeta, ShardingConfig, ZarrCodec
from hsstore.storage import layout
from hsstore.storage.backend import Backend, BufferRange, RangeSource
from hsstore.storage.codecs import REGISTRY, codec_of, compressors
from hsstore.storage.fileio import convert_strict, parse_json

if TYPE_CHECKING:
    from typing_extensions import Buffer

# --- Memory the shard reader reuses: a per-thread scratch buffer for chunk bytes, and recently decoded


class Scratch:
    """A growable byte buffer one thread reuses for every chunk it reads (no allocation per chunk)."""

    def __init__(self) -> None:
        self.buf = bytearray(0)

    def view(self, n: int) -> memoryview:
        if len(self.buf) < n:
            self.buf = bytearray(max(n, 2 * len(self.buf)))
        return memoryview(self.buf)[:n]


_local = threading.local()


def scratch(use: str = "chunk") -> Scratch:
    """This thread's scratch buffer for ``use`` ("chunk": a chunk's stored bytes; "codes": FP8 codes on
    their way to bf16)."""
    s = getattr(_local, use, None)
    if s is None:
        s = Scratch()
        setattr(_local, use, s)
    return s


class DecodedChunks:
    """Recently decoded chunks that hold more rows than one read took (chunks of ~1 MiB hold many
    short samples at a small hidden size: the next sample's read finds its chunk decoded). Bounded by
    bytes, least recently used out first; committed chunks never change, so an entry never goes stale.
    A chunk every row of which has been read since it was decoded goes out at once, and its memory is
    the next decode's (memory just read is in the CPU's cache: decoding a 256 KiB chunk into it took
    ~130 us, into fresh memory ~160 us; docs/notes/benchmarks-history.md, "Round 4 on 2 cores")."""

    def __init__(self, max_bytes: int, spares: int = 4) -> None:
        self.max_bytes, self.bytes, self.spares = max_bytes, 0, spares
        self.items: OrderedDict[tuple[int, int], tuple[np.ndarray, list[int]]] = OrderedDict()  # chunk, [rows unread]
        self.spare: list[np.ndarray] = []  # buffers of chunks gone out, the most recent last
        self.lock = ForkSafeLock()  # (a DataLoader may fork while a reading thread holds it)

    def copy_rows(self, key: tuple[int, int], first: int, dest: np.ndarray) -> bool:
        """Rows ``first .. first + len(dest)`` of chunk ``key`` copied into ``dest``; False if it is not held."""
        with self.lock:  # (copied under the lock: a buffer gone out is reused, never while read from)
            hit = self.items.get(key)
            if hit is None:
                return False
            chunk, unread = hit
            dest[...] = chunk[first : first + dest.shape[0]]
            unread[0] -= dest.shape[0]
            if unread[0] <= 0:  # every row read (in order, the chunk's last reader): out, its memory reused
                del self.items[key]
                self.bytes -= chunk.nbytes
                self._spare(chunk)
            else:
                self.items.move_to_end(key)
            return True

    def buffer(self, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
        """An array to decode a chunk into: the memory of one gone out if one fits, else new."""
        with self.lock:
            for i in range(len(self.spare) - 1, -1, -1):
                if self.spare[i].shape == shape and self.spare[i].dtype == dtype:
                    return self.spare.pop(i)
        return np.empty(shape, dtype)

    def put(self, key: tuple[int, int], chunk: np.ndarray, unread: int) -> None:
        """Hold ``chunk`` (from ``buffer``), ``unread`` of its rows not read yet."""
        if chunk.nbytes > self.max_bytes // 4:
            return
        with self.lock:
            if key in self.items:  # (another thread decoded it too)
                self._spare(chunk)
                return
            self.items[key] = (chunk, [unread])
            self.bytes += chunk.nbytes
            while self.bytes > self.max_bytes:
                _, (old, _) = self.items.popitem(last=False)
                self.bytes -= old.nbytes
                self._spare(old)

    def _spare(self, chunk: np.ndarray) -> None:
        self.spare.append(chunk)
        if len(self.spare) > self.spares:
            del self.spare[0]


DECODED = DecodedChunks(64 << 20)
_serials = itertools.count()


def next_serial() -> int:
    """A number naming one shard reader's chunks in ``DECODED`` (never reused in a process)."""
    return next(_serials)


EMPTY = np.uint64(2**64 - 1)
EMPTY_INT = 2**64 - 1
DATA_TYPES = ("int32", "uint8", "uint16", "float16", "float32")  # what hsstore writes (bf16: uint16 bits)


def _crc(data: Buffer) -> bytes:
    return crc32c.crc32c(data).to_bytes(4, "little")


def encode_shard(data: np.ndarray, chunk_rows: int, codec: str) -> list[Buffer]:
    """The shard file of ``data`` (rows chunked by ``chunk_rows``) as a list of buffers to write in order."""
    data = np.ascontiguousarray(data)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    comp = REGISTRY[codec].numcodec(data.dtype.itemsize)
    n = data.shape[0]
    n_chunks = max(1, -(-n // chunk_rows))
    index = np.empty((n_chunks, 2), dtype="<u8")
    parts: list[Buffer] = []
    off = 0
    for k in range(n_chunks):
        block = data[k * chunk_rows : (k + 1) * chunk_rows]
        if block.shape[0] < chunk_rows:  # zarr chunks are full-sized: pad with the fill value (0)
            pad = np.zeros((chunk_rows, *data.shape[1:]), dtype=data.dtype)
            pad[: block.shape[0]] = block
            block = pad
        payload = block.data.cast("B") if comp is None else comp.encode(block)
        parts += [payload, _crc(payload)]
        index[k] = (off, len(payload) + 4)
        off += len(payload) + 4
    idx = index.tobytes()
    parts += [idx, _crc(idx)]
    return parts


def array_metadata(
    shape: tuple[int, ...], chunk_rows: int, dtype: np.dtype, codec: str, attributes: dict[str, Any]
) -> bytes:
    """The ``zarr.json`` zarr-python writes for a single-shard array of ``shape`` (rendered in memory by
    zarr itself, so it is the metadata of whichever zarr version is installed; zarr is imported here, on
    the write path only)."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.storage import MemoryStore

    mem = MemoryStore()
    shard = -(-shape[0] // chunk_rows) * chunk_rows
    zarr.create_array(
        mem,
        name="a",
        shape=shape,
        chunks=(chunk_rows, *shape[1:]),
        shards=(shard, *shape[1:]),
        dtype=dtype,
        compressors=compressors(codec),
        fill_value=0,
        config={"write_empty_chunks": True},
        attributes=attributes,
    )
    written = sync(mem.get(layout.array_files("a", len(shape))[0], prototype=default_buffer_prototype()))
    if written is None:
        raise AssertionError("zarr wrote no array metadata")  # it just did: create_array wrote it
    return written.to_bytes()


@dataclass(frozen=True)
class ArrayLayout:
    """How an array's one chunk file is laid out: ``sharded`` (chunks of ``chunk_rows`` and an index at
    the end) or one plain chunk of all rows (format 1.0 token arrays)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_rows: int
    codec: str
    sharded: bool
    layer: int | None = None  # the decoder layer its attributes say it holds (layer arrays; None where they say none)


def _middle(chain: list[ZarrCodec]) -> list[tuple[str, dict[str, Any]]] | None:
    """The codecs between ``bytes`` (little-endian) and ``crc32c``; None if the chain is not that shape."""
    if len(chain) < 2 or chain[0].name != "bytes" or chain[-1].name != "crc32c":
        return None
    if chain[0].configuration.get("endian", "little") != "little":
        return None
    return [(c.name, c.configuration) for c in chain[1:-1]]


def array_layout(raw: bytes, what: str) -> ArrayLayout:
    """The layout of the array whose ``zarr.json`` is ``raw``; CorruptData for anything hsstore never writes."""
    meta = convert_strict(parse_json(raw, what), ArrayMeta, what)
    shape, grid = meta.shape, meta.chunk_grid.configuration.chunk_shape
    if (
        meta.node_type != "array"
        or meta.zarr_format != 3
        or not 1 <= len(shape) <= 2
        or shape[0] < 1
        or min(shape) < 1
        or meta.data_type not in DATA_TYPES
        or len(grid) != len(shape)
    ):
        raise CorruptData(f"{what}: not an array hsstore writes (shape {shape}, {meta.data_type})")
    dtype = np.dtype(meta.data_type).newbyteorder("<")
    said = meta.attributes.get("layer") if isinstance(meta.attributes, dict) else None
    layer = said if isinstance(said, int) and not isinstance(said, bool) else None
    if len(meta.codecs) == 1 and meta.codecs[0].name == "sharding_indexed":
        cfg = convert_strict(meta.codecs[0].configuration, ShardingConfig, f"{what}: sharding configuration")
        middle, index = _middle(cfg.codecs), _middle(cfg.index_codecs)
        codec = codec_of(middle) if middle is not None else None
        rows = cfg.chunk_shape[0] if cfg.chunk_shape else 0
        if (
            codec
            and index == []
            and cfg.index_location == "end"
            and grid[0] >= shape[0]
            and rows >= 1
            and grid[1:] == shape[1:]
            and cfg.chunk_shape[1:] == shape[1:]
        ):
            return ArrayLayout(tuple(shape), dtype, rows, codec, True, layer)
    else:
        middle = _middle(meta.codecs)
        codec = codec_of(middle) if middle is not None else None
        if codec and grid == shape:
            return ArrayLayout(tuple(shape), dtype, shape[0], codec, False, layer)
    raise CorruptData(f"{what}: its codecs or chunking are not a layout hsstore writes")


def check_declared_bytes(nbytes: int, what: str) -> None:
    """CorruptData when a store's records declare more bytes than this machine has memory (a sample of 10^10
    tokens, a chunk of 10^9 rows): damaged or forged records, refused before anything is allocated."""
    if nbytes > physical_memory():
        raise CorruptData(
            f"{what} declares {byte_size(nbytes)}, more than this machine's {byte_size(physical_memory())} "
            "of memory: its records are damaged or forged (hsstore writes no such thing). Run `hsstore verify`"
        )


class ShardReader:
    """Reads row ranges of one array, verifying every chunk's crc32c (and the shard index's)."""

    def __init__(self, io: Backend, key: str, what: str) -> None:
        self.what = what
        raw = io.get(f"{key}/{layout.META}")
        if raw is None:
            raise CorruptData(f"{what}: {key}/{layout.META} is missing")
        lay = array_layout(raw, f"{what}: {key}/{layout.META}")
        self.layout, self.shape, self.dtype, self.chunk_rows = lay, lay.shape, lay.dtype, lay.chunk_rows
        self.row_width = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        self.comp = REGISTRY[lay.codec].numcodec(self.dtype.itemsize)
        check_declared_bytes(self.chunk_rows * self.row_width * self.dtype.itemsize, f"{what}: a chunk")
        try:
            self.src = io.open_range(layout.array_files(key, len(self.shape))[1])
        except FileNotFoundError:
            raise CorruptData(f"{what}: its chunk file is missing") from None
        self.size = self.src.size
        self.bytes_read = 0
        self.serial = next_serial()  # names this reader's chunks in the decoded-chunk cache
        self.verified: set[int] = set()  # uncompressed chunks whose crc32c this reader has checked whole
        self.index = self._index() if lay.sharded else np.array([[0, self.size]], dtype="<u8")
        self.spans = [(int(o), int(n)) for o, n in self.index]  # (offset, bytes) per chunk as Python ints

    def _index(self) -> np.ndarray:
        n_chunks = max(1, -(-self.shape[0] // self.chunk_rows))
        n_idx = 16 * n_chunks + 4
        raw = self.src.read(self.size - n_idx, n_idx) if self.size >= n_idx else b""
        self.bytes_read += len(raw)
        if len(raw) != n_idx or _crc(raw[:-4]) != raw[-4:]:
            raise CorruptData(f"{self.what}: shard index is corrupt (checksum mismatch or truncated file)")
        return np.frombuffer(raw[:-4], dtype="<u8").reshape(n_chunks, 2)

    def close(self) -> None:
        self.src.close()

    def rows(self, a: int, b: int, out: np.ndarray | None = None, src: BufferRange | None = None) -> np.ndarray:
        """Rows ``[a, b)`` of shape ``(b - a, *shape[1:])``, into ``out`` if given (it may be a strided
        view, e.g. one layer's slot of a ``[T, n_layers, H]`` buffer: rows land there directly); ``src``:
        chunk bytes already fetched (part of ``need_span``'s range), checked as if read here."""
        if not 0 <= a <= b <= self.shape[0]:
            raise CorruptData(f"{self.what}: rows [{a}, {b}) are outside the array's {self.shape[0]} rows")
        c, w = self.chunk_rows, self.row_width
        if out is None:
            check_declared_bytes((b - a) * w * self.dtype.itemsize, f"{self.what}: rows [{a}, {b})")
            out = np.empty((b - a, *self.shape[1:]), dtype=self.dtype)
        flat = out.reshape(b - a, w) if out.ndim != 2 else out  # a view: rows stay where they are
        ks = range(a // c, (b - 1) // c + 1 if b > a else a // c)
        for k in ks:
            off, nbytes = self.spans[k]
            if off == EMPTY_INT or nbytes < 4 or off + nbytes > self.size:
                raise CorruptData(f"{self.what}: chunk {k} is missing or beyond the end of the shard")
        here = self._span(ks) if self.src.coalesce and len(ks) > 1 and src is None else self.src
        for k in ks:
            off, nbytes = self.spans[k]
            lo, hi = max(a, k * c), min(b, (k + 1) * c)
            dest = flat[lo - a : hi - a]
            whole = lo == k * c and hi == (k + 1) * c
            at = src if src is not None and src.covers(off, nbytes) else here  # (a chunk not fetched: read here)
            if not self._read_in_place(at, dest, k, off, nbytes, whole):
                self._decode_into(at, dest, k, off, nbytes, lo - k * c)
        return out

    def need_span(self, a: int, b: int) -> tuple[int, int] | None:
        """(offset, bytes) of the file range holding the chunks of rows ``[a, b)``; None if there is none."""
        if not 0 <= a < b <= self.shape[0]:
            return None
        lo, hi = a // self.chunk_rows, (b - 1) // self.chunk_rows
        spans = [(o, n) for o, n in self.spans[lo : hi + 1] if o != EMPTY_INT and o + n <= self.size]
        if not spans:
            return None
        start = min(o for o, _ in spans)
        return start, max(o + n for o, n in spans) - start

    def _span(self, ks: range) -> RangeSource:
        """The chunks ``ks`` fetched in one read (one round trip on an object store), if they lie together."""
        spans = [self.spans[k] for k in ks]
        lo, hi = min(o for o, _ in spans), max(o + n for o, n in spans)
        if hi - lo > 2 * sum(n for _, n in spans):
            return self.src  # scattered chunks (another writer's layout): read one by one
        data = self.src.read(lo, hi - lo)
        self.bytes_read += len(data)
        return BufferRange(data, lo)

    def _read_in_place(self, src: RangeSource, dest: np.ndarray, k: int, off: int, nbytes: int, whole: bool) -> bool:
        """An uncompressed whole chunk read straight into a contiguous ``dest`` (one ``preadv``)."""
        row_bytes = self.row_width * self.dtype.itemsize
        if (
            self.comp is not None
            or not whole
            or not dest.flags.c_contiguous
            or nbytes != self.chunk_rows * row_bytes + 4
        ):
            return False
        view = dest.data.cast("B")
        tail = bytearray(4)
        got = src.readinto([view, memoryview(tail)], off)
        self.bytes_read += got if src is self.src else 0
        if got != nbytes or crc32c.crc32c(view).to_bytes(4, "little") != bytes(tail):
            raise CorruptData(f"{self.what}: chunk {k} fails its crc32c checksum")
        return True

    def _decode_into(self, src: RangeSource, dest: np.ndarray, k: int, off: int, nbytes: int, first: int) -> None:
        """Rows ``first .. first + len(dest)`` of chunk ``k`` into ``dest`` (any row stride): read into this
        thread's scratch buffer, checked, then decoded straight into ``dest`` when it is the whole chunk
        and contiguous, else taken from the decoded-chunk cache, or decoded (in this thread's reused buffer,
        or for a chunk holding other samples' rows too, into one the cache then holds) and copied."""
        if DECODED.copy_rows((self.serial, k), first, dest):
            return
        buf = scratch()
        rows = dest.shape[0]
        if self.comp is None and k in self.verified:  # checked whole once: read just the rows wanted
            self._raw_rows(src, dest, k, off, first, buf)
            return
        payload = self._payload(src, k, off, nbytes, buf)
        if self.comp is None:
            if payload.nbytes != self.chunk_rows * self.row_width * self.dtype.itemsize:
                raise CorruptData(
                    f"{self.what}: chunk {k} holds {payload.nbytes} bytes, not the "
                    f"{self.chunk_rows} x {self.row_width} values its metadata declare"
                )
            dest[...] = np.frombuffer(payload, dtype=self.dtype).reshape(self.chunk_rows, self.row_width)[
                first : first + rows
            ]
            self.verified.add(k)
            return
        shape = (self.chunk_rows, self.row_width)
        unread = min(self.chunk_rows, self.shape[0] - k * self.chunk_rows) - rows  # (the last chunk's padding: none)
        keep = unread > 0
        if rows == self.chunk_rows and dest.flags.c_contiguous:
            chunk = dest
        elif keep:  # the chunk holds other samples' rows too: the next read may want them
            chunk = DECODED.buffer(shape, self.dtype)
        else:  # only this read wants it: decoded in this thread's reused (so cache-warm) buffer
            chunk = np.frombuffer(
                scratch("decoded").view(shape[0] * shape[1] * self.dtype.itemsize), self.dtype
            ).reshape(shape)
        try:
            self.comp.decode(payload, out=chunk)
        except Exception as e:  # noqa: BLE001 - a decoder error on checksummed data is corruption too
            raise CorruptData(f"{self.what}: chunk {k} does not decode ({str(e)[:100]})") from None
        if chunk is not dest:
            dest[...] = chunk[first : first + rows]
        if keep:
            DECODED.put((self.serial, k), chunk, unread)

    def _raw_rows(self, src: RangeSource, dest: np.ndarray, k: int, off: int, first: int, scratch: Scratch) -> None:
        """Rows of uncompressed chunk ``k``, whose crc32c this reader has checked, read alone into ``dest``."""
        row_bytes = self.row_width * self.dtype.itemsize
        n = dest.shape[0] * row_bytes
        view = dest.data.cast("B") if dest.flags.c_contiguous else scratch.view(n)
        got = src.readinto([view], off + first * row_bytes)
        self.bytes_read += got if src is self.src else 0
        if got != n:
            raise CorruptData(f"{self.what}: chunk {k} is shorter than its index says")
        if not dest.flags.c_contiguous:
            dest[...] = np.frombuffer(view, dtype=self.dtype).reshape(dest.shape)

    def _payload(self, src: RangeSource, k: int, off: int, nbytes: int, scratch: Scratch) -> memoryview:
        """Chunk ``k``'s checked payload (without its crc32c), read into ``scratch``."""
        if isinstance(src, BufferRange):  # fetched already: checked and decoded where it lies
            view = src.view(off, nbytes)
            got = view.nbytes
        else:
            view = scratch.view(nbytes)
            got = src.readinto([view], off)
            self.bytes_read += got if src is self.src else 0
        payload = view[:-4]
        if got != nbytes or _crc(payload) != bytes(view[-4:]):
            raise CorruptData(f"{self.what}: chunk {k} fails its crc32c checksum")
        return payload

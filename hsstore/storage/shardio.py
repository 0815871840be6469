"""Direct I/O of single-shard zarr v3 arrays: the hot path of building and reading, same bytes as zarr.

hsstore stores each unit's arrays as one zarr ``sharding_indexed`` shard (inner chunks of ``c`` rows,
codecs ``bytes(little) -> [zstd | blosc] -> crc32c``, index ``bytes -> crc32c`` at the end). zarr-python
reads and writes that format through a general async pipeline that costs milliseconds per call; this
module writes and reads exactly the same bytes with plain ``pwrite``/``preadv`` and one codec call per
chunk, checking every crc32c. Any zarr v3 reader opens what it writes (a test checks both ways).
"""

from __future__ import annotations

import json
import os
from typing import Any

import crc32c
import numpy as np
import zarr
from numcodecs import Blosc, Zstd
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from hsstore.storage.codecs import SHUFFLE_BLOCK_BYTES, compressors
from hsstore.core.errors import CorruptData

EMPTY = np.uint64(2**64 - 1)


def compressor(codec: str, itemsize: int) -> Any:
    if codec == "none":
        return None
    if codec == "zstd":
        return Zstd(level=1)
    if codec == "shuffle-zstd":
        return Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=SHUFFLE_BLOCK_BYTES, typesize=itemsize)
    if codec == "blosc-lz4":
        return Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE, blocksize=0, typesize=itemsize)
    if codec == "blosc-zstd":
        return Blosc(cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE, blocksize=0, typesize=itemsize)
    raise ValueError(f"unknown compression {codec!r}")


def _crc(data: Any) -> bytes:
    return crc32c.crc32c(data).to_bytes(4, "little")


def encode_shard(data: np.ndarray, chunk_rows: int, codec: str) -> list[Any]:
    """The shard file of ``data`` (rows chunked by ``chunk_rows``) as a list of buffers to write in order."""
    data = np.ascontiguousarray(data)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    comp = compressor(codec, data.dtype.itemsize)
    n = data.shape[0]
    n_chunks = max(1, -(-n // chunk_rows))
    index = np.empty((n_chunks, 2), dtype="<u8")
    parts: list[Any] = []
    off = 0
    for k in range(n_chunks):
        block = data[k * chunk_rows : (k + 1) * chunk_rows]
        if block.shape[0] < chunk_rows:  # zarr chunks are full-sized: pad with the fill value (0)
            pad = np.zeros((chunk_rows, *data.shape[1:]), dtype=data.dtype)
            pad[: block.shape[0]] = block
            block = pad
        payload = memoryview(block).cast("B") if comp is None else comp.encode(block)
        parts += [payload, _crc(payload)]
        index[k] = (off, len(payload) + 4)
        off += len(payload) + 4
    idx = index.tobytes()
    parts += [idx, _crc(idx)]
    return parts


def array_metadata(shape: tuple[int, ...], chunk_rows: int, dtype: np.dtype, codec: str,
                   attributes: dict[str, Any]) -> bytes:
    """The ``zarr.json`` zarr-python writes for a single-shard array of ``shape`` (rendered in memory by
    zarr itself, so it is the metadata of whichever zarr version is installed)."""
    mem = MemoryStore()
    shard = -(-shape[0] // chunk_rows) * chunk_rows
    zarr.create_array(
        mem, name="a", shape=shape, chunks=(chunk_rows, *shape[1:]), shards=(shard, *shape[1:]), dtype=dtype,
        compressors=compressors(codec), fill_value=0, config={"write_empty_chunks": True}, attributes=attributes,
    )
    return sync(mem.get("a/zarr.json", prototype=default_buffer_prototype())).to_bytes()


def shard_layout(meta: dict[str, Any]) -> tuple[int, str] | None:
    """(inner chunk rows, codec name) if the array's zarr.json is a single-shard array this module reads."""
    codecs = meta.get("codecs", [])
    shape = meta.get("shape", [])
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed" or not shape:
        return None
    grid = meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape", [])
    cfg = codecs[0]["configuration"]
    inner = [c["name"] for c in cfg["codecs"]]
    if not grid or grid[0] < shape[0] or list(grid[1:]) != list(shape[1:]) or cfg.get("index_location", "end") != "end":
        return None
    if [c["name"] for c in cfg["index_codecs"]] != ["bytes", "crc32c"] or inner[0] != "bytes" or inner[-1] != "crc32c":
        return None
    middle = cfg["codecs"][1:-1]
    if not middle:
        codec = "none"
    elif len(middle) == 1 and middle[0]["name"] == "zstd":
        codec = "zstd"
    elif len(middle) == 1 and middle[0]["name"] == "blosc":
        conf = middle[0]["configuration"]
        codec = "shuffle-zstd" if conf["cname"] == "zstd" and conf.get("shuffle") == "shuffle" else \
            {"lz4": "blosc-lz4", "zstd": "blosc-zstd"}.get(conf["cname"], "")  # (blosc decoding is self-describing)
    else:
        return None
    if not codec or list(cfg["chunk_shape"][1:]) != list(shape[1:]):
        return None
    return int(cfg["chunk_shape"][0]), codec


class ShardReader:
    """Reads row ranges of one single-shard array, verifying every chunk's crc32c."""

    def __init__(self, array_dir: str, what: str) -> None:
        with open(os.path.join(array_dir, "zarr.json"), "rb") as f:
            meta = json.loads(f.read())
        layout = shard_layout(meta)
        if layout is None:
            raise ValueError(f"{array_dir} is not a single-shard array of a known layout")
        self.chunk_rows, codec = layout
        self.shape = tuple(meta["shape"])
        self.dtype = np.dtype(meta["data_type"]).newbyteorder("<")
        self.what = what
        self.row_width = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        self.comp = compressor(codec, self.dtype.itemsize)
        self.fd = os.open(os.path.join(array_dir, "c", *["0"] * len(self.shape)), os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        n_chunks = max(1, -(-self.shape[0] // self.chunk_rows))
        n_idx = 16 * n_chunks + 4
        raw = os.pread(self.fd, n_idx, size - n_idx) if size >= n_idx else b""
        if len(raw) != n_idx or _crc(raw[:-4]) != raw[-4:]:
            raise CorruptData(f"{what}: shard index is corrupt (checksum mismatch or truncated file)")
        self.index = np.frombuffer(raw[:-4], dtype="<u8").reshape(n_chunks, 2)
        self.size = size
        self.bytes_read = n_idx

    def close(self) -> None:
        os.close(self.fd)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass

    def rows(self, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[a, b)`` of shape ``(b - a, *shape[1:])``, into ``out`` if given (it may be a strided
        view, e.g. one layer's slot of a ``[T, n_layers, H]`` buffer: rows land there directly)."""
        c, w = self.chunk_rows, self.row_width
        if out is None:
            out = np.empty((b - a, *self.shape[1:]), dtype=self.dtype)
        flat = out.reshape(b - a, w) if out.ndim != 2 else out  # a view: rows stay where they are
        row_bytes = w * self.dtype.itemsize
        rows_contiguous = flat.strides[-1] == self.dtype.itemsize
        tail = bytearray(4)
        for k in range(a // c, (b - 1) // c + 1 if b > a else a // c):
            off, nbytes = (int(x) for x in self.index[k])
            if self.index[k][0] == EMPTY or off + nbytes > self.size:
                raise CorruptData(f"{self.what}: chunk {k} is missing or beyond the end of the shard")
            lo, hi = max(a, k * c), min(b, (k + 1) * c)
            whole = lo == k * c and hi == (k + 1) * c
            if self.comp is None and whole and rows_contiguous and nbytes == c * row_bytes + 4:
                dest = flat[lo - a : hi - a]
                if dest.flags.c_contiguous:
                    views = [memoryview(dest).cast("B")]
                else:  # one iovec per row: straight into a strided destination
                    views = [memoryview(r).cast("B") for r in dest]
                got = os.preadv(self.fd, [*views, tail], off)
                self.bytes_read += got
                crc = 0
                for v in views:
                    crc = crc32c.crc32c(v, crc)
                if got != nbytes or crc.to_bytes(4, "little") != bytes(tail):
                    raise CorruptData(f"{self.what}: chunk {k} fails its crc32c checksum")
                continue
            buf = os.pread(self.fd, nbytes, off)
            self.bytes_read += len(buf)
            payload = memoryview(buf)[:-4]
            if len(buf) != nbytes or _crc(payload) != buf[-4:]:
                raise CorruptData(f"{self.what}: chunk {k} fails its crc32c checksum")
            try:
                raw = payload if self.comp is None else self.comp.decode(payload)
                chunk = np.frombuffer(raw, dtype=self.dtype).reshape(c, w)
            except Exception as e:  # noqa: BLE001 - a decoder error on checksummed data is corruption too
                raise CorruptData(f"{self.what}: chunk {k} does not decode ({e})") from None
            flat[lo - a : hi - a] = chunk[lo - k * c : hi - k * c]
        return out

"""The codec registry: each compression choice once, with its zarr v3 chain, its numcodecs implementation
(what the direct shard I/O encodes and decodes with) and the matcher that recognises it in metadata.

Every chain is ``bytes -> [compressor] -> crc32c``, so each chunk carries a checksum whatever the codec.

``shuffle-zstd`` (the default) is blosc: each chunk's bytes split into planes by byte position (a bf16
value's sign and exponent byte apart from its noisy low mantissa byte), then zstd-1, one blosc block per
chunk. On bf16 hidden states it is the smallest of these (1.42-1.48x vs zstd's 1.24-1.30x), decodes at
0.8-2.0x and encodes at 0.45-0.75x zstd's speed (docs/benchmarks.md, "Codecs"); ``blosc-lz4`` is the
fast one (2-3x zstd's speeds, 1.14-1.22x smaller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from numcodecs import Blosc, Zstd

# a blosc block of at least one chunk (chunks hold 256 KiB-1 MiB, see chunk_tokens): blosc shuffles and
# compresses per block, and smaller blocks lose most of the gain (1.24x instead of 1.42x smaller)
SHUFFLE_BLOCK_BYTES = 1 << 20
TOKEN_CHUNK_ROWS = 1 << 16  # rows of input_ids / loss_mask per chunk (stored without a codec)
SCALE_CHUNK_ROWS = 4096  # rows of FP8 per-token scales per chunk (16 KB): a sample's read touches one or two
DEFAULT = "shuffle-zstd"  # the smallest on bf16 states: caches run to 10+ TB (docs/benchmarks.md)


@dataclass(frozen=True)
class Codec:
    """One compression choice. ``chain``: the zarr codecs between ``bytes`` and ``crc32c`` (empty for
    none); ``numcodec(itemsize)``: what encodes/decodes a chunk (None: raw bytes); ``matches(middle)``:
    whether zarr metadata's codecs between ``bytes`` and ``crc32c`` are this choice."""

    name: str
    chain: Callable[[], list[Any]]
    numcodec: Callable[[int], Any]
    matches: Callable[[list[tuple[str, dict[str, Any]]]], bool]


def _zarr(name: str, **configuration: Any) -> Any:
    """zarr's codec class ``name`` configured: zarr is imported only to write an array's metadata (reading
    a local store never needs it)."""
    import zarr.codecs

    return getattr(zarr.codecs, name)(**configuration)


def _blosc(cname: str, byte_shuffle: bool | None) -> Callable[[list[tuple[str, dict[str, Any]]]], bool]:
    """Blosc with ``cname``; ``byte_shuffle`` True/False tells the zstd pair apart (None: any shuffle;
    blosc decoding is self-describing, so the shuffle never changes how a chunk is read)."""
    return lambda m: (
        len(m) == 1
        and m[0][0] == "blosc"
        and m[0][1].get("cname") == cname
        and (byte_shuffle is None or (m[0][1].get("shuffle") == "shuffle") == byte_shuffle)
    )


REGISTRY: dict[str, Codec] = {
    c.name: c
    for c in (
        Codec("none", lambda: [], lambda itemsize: None, lambda m: m == []),
        Codec(
            "zstd",
            lambda: [_zarr("ZstdCodec", level=1)],
            lambda itemsize: Zstd(level=1),
            lambda m: len(m) == 1 and m[0][0] == "zstd",
        ),
        Codec(
            "shuffle-zstd",
            lambda: [_zarr("BloscCodec", cname="zstd", clevel=1, shuffle="shuffle", blocksize=SHUFFLE_BLOCK_BYTES)],
            lambda itemsize: Blosc(
                cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=SHUFFLE_BLOCK_BYTES, typesize=itemsize
            ),
            _blosc("zstd", True),
        ),
        Codec(
            "blosc-lz4",
            lambda: [_zarr("BloscCodec", cname="lz4", clevel=5, shuffle="bitshuffle")],
            lambda itemsize: Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE, blocksize=0, typesize=itemsize),
            _blosc("lz4", None),
        ),
        Codec(
            "blosc-zstd",
            lambda: [_zarr("BloscCodec", cname="zstd", clevel=1, shuffle="bitshuffle")],
            lambda itemsize: Blosc(cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE, blocksize=0, typesize=itemsize),
            _blosc("zstd", False),
        ),
    )
}
CHOICES = tuple(REGISTRY)


def kept_codec_note(vid: str, kept: str, asked: str) -> str:
    """What a command asking existing variant ``vid`` for another codec says: a codec changes no number."""
    return (
        f"variant {vid} keeps its codec {kept} (codec {asked} was asked for): a codec changes no stored number, "
        "so it is not a new variant; it applies to new variants and stores"
    )


def parse_codec(name: str) -> str:
    if name not in REGISTRY:
        raise ValueError(f"unknown compression {name!r}; choose one of {', '.join(CHOICES)}")
    return name


def compressors(name: str) -> list[Any]:
    """The bytes-to-bytes chain for ``name``: compression (if any) then crc32c."""
    return [*REGISTRY[parse_codec(name)].chain(), _zarr("Crc32cCodec")]


def codec_of(middle: list[tuple[str, dict[str, Any]]]) -> str | None:
    """The registered codec whose zarr chain is ``middle`` (name, configuration pairs), or None."""
    return next((c.name for c in REGISTRY.values() if c.matches(middle)), None)


# A layer's chunk: about CHUNK_BYTES, but no more than about CHUNK_ROWS rows (a typical sample: a read
# of one sample at a small hidden size decodes little else) where that keeps it at MIN_CHUNK_BYTES or more
# (blosc blocks under 256 KiB compress bf16 states 1.23x instead of 1.40x and decode ~3x slower:
# docs/benchmarks.md, "Codecs"). Readers read any chunking: the rows are in each array's
# metadata.
CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 256 << 10
CHUNK_ROWS = 1024


def chunk_tokens(hidden_size: int, itemsize: int, target_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk of one layer: about ``target_bytes`` of states, capped at ``CHUNK_ROWS`` rows where
    that leaves ``MIN_CHUNK_BYTES`` or more (at least 1). Hidden 4096 bf16: 128; 1024: 512; 256: 1024;
    64: 2048 (256 KiB)."""
    row = max(1, hidden_size * itemsize)
    return max(1, min(target_bytes // row, max(CHUNK_ROWS, MIN_CHUNK_BYTES // row)))

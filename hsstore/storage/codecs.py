"""Per-variant compression choices, as names recorded in metadata, and their zarr v3 codec chains.

Every chain ends in crc32c, so each chunk carries a checksum whatever the compression.

``shuffle-zstd`` (the default) is blosc: each chunk's bytes split into planes by byte position (a bf16
value's sign and exponent byte apart from its noisy low mantissa byte), then zstd-1, one blosc block per
chunk. On bf16 hidden states it is the smallest of these (1.42-1.48x vs zstd's 1.24-1.30x), decodes at
0.8-2.0x and encodes at 0.45-0.75x zstd's speed (docs/benchmarks.md, "Codecs"); ``blosc-lz4`` is the
fast one (2-3x zstd's speeds, 1.14-1.22x smaller).
"""

from __future__ import annotations

from typing import Any

from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

CHOICES = ("none", "zstd", "shuffle-zstd", "blosc-lz4", "blosc-zstd")
# a blosc block of at least one chunk (chunks hold ~1 MiB, see chunk_tokens): blosc shuffles and
# compresses per block, and smaller blocks lose most of the gain (1.24x instead of 1.42x smaller)
SHUFFLE_BLOCK_BYTES = 1 << 20
DEFAULT = "shuffle-zstd"  # the smallest on bf16 states: caches run to 10+ TB (docs/benchmarks.md)


def parse_codec(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"unknown compression {name!r}; choose one of {', '.join(CHOICES)}")
    return name


def compressors(name: str) -> list[Any]:
    """The bytes-to-bytes chain for ``name``: compression (if any) then crc32c."""
    name = parse_codec(name)
    chain: list[Any] = []
    if name == "zstd":
        chain.append(ZstdCodec(level=1))
    elif name == "shuffle-zstd":
        chain.append(BloscCodec(cname="zstd", clevel=1, shuffle="shuffle", blocksize=SHUFFLE_BLOCK_BYTES))
    elif name == "blosc-lz4":
        chain.append(BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"))
    elif name == "blosc-zstd":
        chain.append(BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"))
    chain.append(Crc32cCodec())
    return chain


def chunk_tokens(hidden_size: int, itemsize: int, target_bytes: int = 1 << 20) -> int:
    """Tokens per chunk so one chunk of one layer holds about ``target_bytes`` (at least 1)."""
    return max(1, target_bytes // max(1, hidden_size * itemsize))

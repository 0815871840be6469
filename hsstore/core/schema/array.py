"""zarr v3 array metadata (``zarr.json`` of an array), the part hsstore reads: typed, strictly decoded.

zarr writes more keys than these (``fill_value``, ``chunk_key_encoding``, ...); they are allowed and
ignored, since the file is zarr's format, not hsstore's. What hsstore reads must have its type.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ZarrCodec(msgspec.Struct, frozen=True):
    """One codec of a chain: its name and configuration."""

    name: str
    configuration: dict[str, Any] = {}


class ChunkGridConfig(msgspec.Struct, frozen=True):
    chunk_shape: list[int]


class ChunkGrid(msgspec.Struct, frozen=True):
    name: str
    configuration: ChunkGridConfig


class ShardingConfig(msgspec.Struct, frozen=True):
    """Configuration of the ``sharding_indexed`` codec: inner chunks, their chain, the index's chain."""

    chunk_shape: list[int]
    codecs: list[ZarrCodec]
    index_codecs: list[ZarrCodec]
    index_location: str = "end"


class ArrayMeta(msgspec.Struct, frozen=True):
    """An array's ``zarr.json``."""

    zarr_format: int
    node_type: str
    shape: list[int]
    data_type: str
    chunk_grid: ChunkGrid
    codecs: list[ZarrCodec]
    attributes: dict[str, Any] = {}


class GroupMeta(msgspec.Struct, frozen=True):
    """A group's ``zarr.json`` (hsstore's records live in its attributes)."""

    zarr_format: int
    node_type: str
    attributes: dict[str, Any] = {}

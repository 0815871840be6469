"""A zarr store wrapper that counts the bytes read through it (to prove layer-subset reads read less)."""

from __future__ import annotations

from typing import Any

from zarr.storage import WrapperStore


class CountingStore(WrapperStore):
    """Counts bytes and requests of every ``get`` (whole objects and byte ranges)."""

    bytes_read = 0
    requests = 0

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        buf = await self._store.get(key, prototype, byte_range)
        if buf is not None:
            self.bytes_read += len(buf)
            self.requests += 1
        return buf

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
        out = await self._store.get_partial_values(prototype, key_ranges)
        for buf in out:
            if buf is not None:
                self.bytes_read += len(buf)
                self.requests += 1
        return out

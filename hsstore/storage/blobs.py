"""Small whole-object I/O (JSON records) beside zarr arrays, with an atomic put.

On a local filesystem a put writes a temporary file and renames it over the target (fsync'd), so a
reader sees the old object or the new one, never half of one. On object stores a single PUT is already
all-or-nothing; other zarr stores go through zarr's own ``set``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

TMP_PREFIX = ".tmp-"


class Blobs:
    """get / put_atomic / list / delete of whole objects by key, over any zarr store."""

    def __init__(self, store: ZarrStore) -> None:
        self.store = store
        inner = getattr(store, "_store", store)  # see through wrappers (e.g. the byte counter)
        self.root = Path(inner.root) if isinstance(inner, LocalStore) else None

    def get(self, key: str) -> bytes | None:
        if self.root is not None:
            try:
                return (self.root / key).read_bytes()
            except FileNotFoundError:
                return None
        buf = sync(self.store.get(key, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def put_atomic(self, key: str, data: bytes) -> None:
        if self.root is not None:
            target = self.root / key
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            return
        sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if nothing is there yet; True if this call wrote it."""
        if self.root is not None:
            target = self.root / key
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            tmp.write_bytes(data)
            try:
                os.link(tmp, target)  # atomic, fails if the target exists
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
        if self.get(key) is not None:
            return False
        self.put_atomic(key, data)
        return True

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursively), temporary files excluded, sorted."""
        if self.root is not None:
            base = self.root / prefix
            if not base.is_dir():
                return []
            out = []
            for dirpath, _, files in os.walk(base):
                rel = os.path.relpath(dirpath, self.root)
                for f in files:
                    if not f.startswith(TMP_PREFIX):
                        out.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
            return sorted(out)

        async def collect() -> list[str]:
            return [k async for k in self.store.list_prefix(prefix)]

        return sorted(k for k in sync(collect()) if not k.rsplit("/", 1)[-1].startswith(TMP_PREFIX))

    def list_dir(self, prefix: str) -> list[str]:
        """Immediate children names under ``prefix/``."""
        if self.root is not None:
            base = self.root / prefix
            return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

        async def collect() -> list[str]:
            return [k async for k in self.store.list_dir(prefix.rstrip("/") + "/")]

        return sorted(k.rstrip("/") for k in sync(collect()))

    def size(self, key: str) -> int | None:
        if self.root is not None:
            try:
                return (self.root / key).stat().st_size
            except FileNotFoundError:
                return None
        n = sync(self.store.getsize(key)) if sync(self.store.exists(key)) else None
        return None if n is None else int(n)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        if self.root is not None:
            import shutil

            shutil.rmtree(self.root / prefix, ignore_errors=True)
            return len(keys)
        for k in keys:
            sync(self.store.delete(k))
        return len(keys)

    def delete(self, key: str) -> None:
        if self.root is not None:
            (self.root / key).unlink(missing_ok=True)
        else:
            sync(self.store.delete(key))

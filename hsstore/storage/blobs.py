"""Small whole-object I/O (JSON records) beside zarr arrays, with an atomic put.

On a local filesystem a put writes a temporary file and renames it over the target (fsync'd), so a
reader sees the old object or the new one, never half of one. On object stores a single PUT is already
all-or-nothing; other zarr stores go through zarr's own ``set``. Every put checks that all its bytes
were written (hsstore.storage.fileio) and raises ``WriteFailed`` otherwise.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c as crc32c_of
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from hsstore.core.errors import WriteFailed
from hsstore.storage.fileio import Written, digest, fsync_dir, write_file

TMP_PREFIX = ".tmp-"


def write_failed(key: str, e: BaseException) -> WriteFailed:
    """One line naming the key and the operating system's reason."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
    return WriteFailed(f"writing {key} failed: {why}")


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
            self._put_local(key, data, replace=True)
            return
        self._put_remote(key, [data])

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if nothing is there yet; True if this call wrote it."""
        if self.root is not None:
            return self._put_local(key, data, replace=False)
        if self.get(key) is not None:
            return False
        self._put_remote(key, [data])
        return True

    def put_parts(self, key: str, parts: Sequence[Any]) -> Written:
        """Write a new object from buffers in order (not atomically: for files of a unit no reader sees
        before its commit); returns its confirmed size and crc32c."""
        if self.root is None:
            return self._put_remote(key, parts)
        target = self.root / key
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            return write_file(str(target), parts)
        except OSError as e:
            raise write_failed(key, e) from None

    def _put_local(self, key: str, data: bytes, replace: bool) -> bool:
        """A temporary file, fsync'd, then renamed over (``replace``) or linked to (if absent) the target."""
        target = self.root / key
        tmp = target.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_file(str(tmp), [data], exclusive=True)
            if replace:
                os.replace(tmp, target)
            else:
                try:
                    os.link(tmp, target)  # atomic, fails if the target exists
                except FileExistsError:
                    return False
            fsync_dir(str(target.parent))
            return True
        except OSError as e:
            raise write_failed(key, e) from None
        finally:
            tmp.unlink(missing_ok=True)

    def _put_remote(self, key: str, parts: Sequence[Any]) -> Written:
        want = digest(parts)
        data = b"".join(bytes(p) if not isinstance(p, bytes) else p for p in parts)
        try:
            sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))
        except Exception as e:  # noqa: BLE001 - any back end's failure, named in one line
            raise write_failed(key, e) from None
        got = self.size(key)
        if got != want.size:
            raise WriteFailed(f"writing {key} failed: the store holds {got} bytes after a put of {want.size}")
        return want

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

    def crc32c(self, key: str) -> str | None:
        """crc32c (8 hex digits) of the object's bytes, read in blocks; None if it is missing."""
        if self.root is None:
            data = self.get(key)
            return None if data is None else digest([data]).crc32c
        try:
            with open(self.root / key, "rb") as f:
                crc = 0
                while block := f.read(1 << 23):
                    crc = crc32c_of(block, crc)
                return f"{crc:08x}"
        except FileNotFoundError:
            return None

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

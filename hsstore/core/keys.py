"""Sample keys: content hashes of (tokenizer fingerprint, token ids, loss mask)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from hsstore.core.errors import BuildFailed
from hsstore.core.schema.store_records import FileStamp, HashedFile


def sample_key(tokenizer_fingerprint: str, input_ids: np.ndarray, loss_mask: np.ndarray) -> str:
    """xxh3_128 hex of tokenizer fingerprint ‖ int32-LE token bytes ‖ uint8 loss-mask bytes."""
    ids = np.ascontiguousarray(input_ids, dtype="<i4")
    mask = np.ascontiguousarray(loss_mask, dtype=np.uint8)
    if ids.ndim != 1 or ids.shape != mask.shape:
        raise ValueError(f"input_ids {ids.shape} and loss_mask {mask.shape} must be 1-D and of equal length")
    h = xxhash.xxh3_128()
    h.update(tokenizer_fingerprint.encode("ascii"))
    h.update(ids.tobytes())
    h.update(mask.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class SampleTokens:
    """A tokenized sample: its key, token ids (int32) and loss mask (uint8)."""

    key: str
    input_ids: np.ndarray
    loss_mask: np.ndarray

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


# --- Canonical JSON and the xxh3_128 fingerprints built on it.


def _normalize(value: Any) -> Any:
    # floats that are whole numbers hash like ints; tuples like lists; NaN is refused
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"canonical JSON refuses non-finite float {value!r}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    raise TypeError(f"canonical JSON cannot encode {type(value).__name__}: {value!r}")


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only, whole floats as ints: the same value gives the same text."""
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(value: Any) -> str:
    """xxh3_128 hex digest of ``canonical_json(value)``."""
    return xxhash.xxh3_128_hexdigest(canonical_json(value).encode("ascii"))


# --- Content hashes of files: xxh3_128 of every byte, streamed, several files in parallel — and no cache.

_CHUNK = 16 << 20
MAX_THREADS = 8  # xxhash releases the GIL: threads overlap reads and hashing across files

__all__ = ["FileStamp", "HashedFile", "file_hash", "hash_file", "hash_files", "stamp", "tree_files"]


def stamp(path: str | os.PathLike[str]) -> FileStamp:
    """What the filesystem says about the file behind ``path`` (symlinks followed)."""
    st = os.stat(path)
    return FileStamp(dev=st.st_dev, ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)


def hash_file(path: str | os.PathLike[str]) -> HashedFile:
    """The file's size, xxh3_128 hex digest and stamp; BuildFailed if it changed while being read."""
    before = stamp(path)
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    after = stamp(path)
    if after != before or size != before.size:
        raise BuildFailed(
            f"{os.fspath(path)} changed while it was hashed (a copy or download still running?); "
            "re-run when it is complete"
        )
    return HashedFile(size=size, xxh3_128=h.hexdigest(), stamp=after)


def file_hash(path: str | os.PathLike[str]) -> str:
    """xxh3_128 hex of the file's bytes."""
    return hash_file(path).xxh3_128


def hash_files(paths: Sequence[str | os.PathLike[str]], threads: int | None = None) -> dict[str, HashedFile]:
    """``{str(path): HashedFile}`` for every path, hashed in parallel (up to MAX_THREADS files at once)."""
    n = max(1, min(len(paths), threads or MAX_THREADS))
    with ThreadPoolExecutor(n, thread_name_prefix="hsstore-hash") as pool:
        return dict(zip((str(p) for p in paths), pool.map(hash_file, paths)))


def tree_files(path: str | os.PathLike[str]) -> list[Path]:
    """The regular files under a folder, sorted by relative path (a dataset saved with save_to_disk)."""
    root = Path(path)
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())

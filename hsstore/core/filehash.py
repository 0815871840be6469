"""Content hashes of large files, cached by (path, size, mtime) so a 54 GB model is hashed once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash

_CHUNK = 16 << 20


def _cache_path() -> Path:
    base = os.environ.get("HSSTORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hsstore")
    return Path(base) / "file-hashes.json"


def file_hash(path: str | os.PathLike[str]) -> str:
    """xxh3_128 hex of the file's bytes (cached)."""
    p = Path(path).resolve()
    st = p.stat()
    stamp = [st.st_size, st.st_mtime_ns]
    cache_file = _cache_path()
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    hit = cache.get(str(p))
    if hit and hit[:2] == stamp:
        return str(hit[2])
    h = xxhash.xxh3_128()
    with open(p, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    cache[str(p)] = [*stamp, digest]
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return digest

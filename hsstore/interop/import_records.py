"""Import records in the store (which files became which samples) and export records beside the files.

Import records live under ``variants/<vid>/builds/``: ``import-<run>-<seq>.json`` after each unit (an
``ImportChunk``) and ``import-<run>.json`` when a run finishes (an ``ImportDone``). A resumed import
trusts a chunk's entry only while the file's size and mtime, and the shared files' (``context``), are
unchanged, and its key is committed.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash

from hsstore.core.canonical import fingerprint
from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.schema.record import is_set
from hsstore.core.schema.imported import ExportRecord, ImportChunk, ImportDone, ImportEntry
from hsstore.interop.formats.interface import Format, atomic_write
from hsstore.interop.sample import FileDigest, read_bytes

PREFIX = "import-"
RECORD_BYTES = 1 << 20  # one import record's size: far below the record cap whatever the paths' lengths


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def entry_hash(rel: str, size: int, xxh3: str) -> int:
    return int(xxhash.xxh3_128_hexdigest(f"{rel}\t{size}\t{xxh3}".encode()), 16)


def add_hash(total: int, h: int) -> int:
    """Order-free sum of per-file hashes (mod 2^128): the same files give the same fingerprint, whatever
    order they were read in, in O(1) memory."""
    return (total + h) % (1 << 128)


class ImportLog:
    """Reads earlier import records of a variant and writes this run's."""

    def __init__(self, store: Any, vid: str, fmt: Format, root: Path, run: str) -> None:
        from hsstore.storage import layout

        self.store, self.fmt, self.root, self.run = store, fmt, root, run
        self.prefix = layout.builds_prefix(vid)
        self.seq = 0
        self.shared = [read_bytes(root, rel)[1] for rel in fmt.shared_files(root)]
        self.context = fingerprint([[d.rel, d.size, d.xxh3] for d in self.shared]) if self.shared else ""
        self.files_sum = 0
        for d in self.shared:
            self.files_sum = add_hash(self.files_sum, entry_hash(d.rel, d.size, d.xxh3))

    def _chunks(self) -> Iterable[ImportChunk]:
        for key in self.store.io.list(self.prefix):
            name = key.rsplit("/", 1)[-1]
            if not name.startswith(PREFIX) or not name.endswith(".json"):
                continue
            raw = self.store.io.get(key)
            if raw is None:
                continue
            try:
                if json.loads(raw).get("kind") != "import-chunk":
                    continue
                chunk = ImportChunk.from_json(raw, key)
            except (ValueError, AttributeError, CorruptData):
                continue  # an unreadable record only costs re-reading its files
            if chunk.format == self.fmt.name and chunk.context == self.context:
                yield chunk

    def split_known(self, items: list[str], committed: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """(items to read, [(item, key)] already imported and unchanged since)."""
        recorded: dict[str, ImportEntry] = {}
        for chunk in self._chunks():
            for e in chunk.entries:
                recorded[e.item] = e
        todo, known = [], []
        for item in items:
            e = recorded.get(item)
            if e is not None and e.key in committed and all(_unchanged(self.root, f) for f in e.files):
                known.append((item, e.key))
                for rel, size, _, xxh3 in e.files:
                    self.files_sum = add_hash(self.files_sum, entry_hash(rel, size, xxh3))
            else:
                todo.append(item)
        return todo, known

    def _put(self, name: str, record: Any) -> None:
        self.store.io.put_atomic(f"{self.prefix}{name}", json.dumps(record.to_dict()).encode())

    def chunk(self, entries: list[tuple[str, str, list[FileDigest]]], unit: str | None) -> None:
        """Record ``entries`` (written into ``unit``) in as many records as keep each near ``RECORD_BYTES``:
        17k files under a 2,000-character folder are 70 MB of JSON, which no single record may hold."""
        out: list[ImportEntry] = []
        size = 0
        for item, key, files in entries:
            out.append(ImportEntry(item=item, key=key, files=[(f.rel, f.size, f.mtime_ns, f.xxh3) for f in files]))
            size += len(item.encode()) + len(key) + sum(len(f.rel.encode()) + 80 for f in files) + 40
            for f in files:
                self.files_sum = add_hash(self.files_sum, entry_hash(f.rel, f.size, f.xxh3))
            if size >= RECORD_BYTES:
                self._put_chunk(out, unit)
                out, size = [], 0
        if out:
            self._put_chunk(out, unit)

    def _put_chunk(self, entries: list[ImportEntry], unit: str | None) -> None:
        self._put(f"{PREFIX}{self.run}-{self.seq:06d}.json",
                  ImportChunk(kind="import-chunk", run=self.run, seq=self.seq, format=self.fmt.name,
                              context=self.context, unit=unit, entries=entries, created=now()))
        self.seq += 1

    def finish(self, tool: str, n_items: int, keys: set[str], counts: dict[str, int], n_bad: int,
               n_missing: int) -> ImportDone:
        done = ImportDone(
            kind="import", complete=n_bad == 0, run=self.run, tool=tool, format=self.fmt.name,
            path=str(self.root.resolve()), n_items=n_items, n_samples=len(keys), n_written=counts["written"],
            n_present=counts["present"], n_duplicates=counts["duplicates"], n_skipped_bad=n_bad,
            n_missing=n_missing, keys_fingerprint=fingerprint(sorted(keys)),
            files_fingerprint=f"{self.files_sum:032x}", finished_at=now())
        self._put(f"{PREFIX}{self.run}.json", done)
        return done


def _unchanged(root: Path, f: tuple[str, int, int, str]) -> bool:
    try:
        st = os.stat(root / f[0])
    except OSError:
        return False
    return st.st_size == f[1] and st.st_mtime_ns == f[2]


def seal_of(record: ExportRecord) -> str:
    """The fingerprint of every field of an export record but its seal (what ``seal`` is set to)."""
    return fingerprint({k: v for k, v in record.to_dict().items() if k != "seal"})


def named_files(fmt: Format, root: Path) -> list[Path]:
    """Regular files under ``root`` (links not followed) named as an export of the layout names its files."""
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
            and fmt.exported.fullmatch(p.relative_to(root).as_posix())]


def folder_fingerprint(fmt: Format, root: Path, jobs: int) -> str:
    """The files fingerprint an export of ``root``'s files recorded (every file named as the layout's writer
    names them: path, size, xxh3_128), each file read once, on ``jobs`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> int:
        d = read_bytes(root, p.relative_to(root).as_posix())[1]
        return entry_hash(d.rel, d.size, d.xxh3)

    total = 0
    with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="hsstore-seal") as pool:
        for h in pool.map(one, named_files(fmt, root)):
            total = add_hash(total, h)
    return f"{total:032x}"


def untrusted_because(fmt: Format, root: Path, record: ExportRecord, jobs: int) -> str | None:
    """Why the provenance in ``record`` cannot be restored for the files under ``root`` (None: it can): the
    record was edited since the export sealed it, or the files are not the ones it wrote."""
    if not is_set(record.seal):
        return "the record has no seal (an earlier hsstore wrote it): re-export the variant to carry its provenance"
    if record.seal != seal_of(record):
        return "the record was edited since the export wrote it (its seal does not match)"
    if folder_fingerprint(fmt, root, jobs) != record.files_fingerprint:
        return "the folder's files are not the ones the export wrote (a file was changed, added or removed)"
    return None


def read_sidecar(path: Path, fmt: str, fix: str | None = None) -> ExportRecord | None:
    """The export record at ``path`` if there is one (a statement of what the files hold); BadInput naming
    ``fix`` (default: import it as the format it was exported as) if it is another format's."""
    if not path.is_file():
        return None
    rec = ExportRecord.from_json(path.read_bytes(), str(path), error=BadInput)
    if rec.format != fmt:
        raise BadInput(f"{path} says the folder was exported as {rec.format!r}, not {fmt!r}; "
                       f"{fix or f'import it as {rec.format}: hsstore import {rec.format} ...'}")
    return rec


def write_sidecar(path: Path, record: ExportRecord) -> None:
    """Write the export record beside the files, all or nothing, as the files are written (atomic_write:
    its temporary file is one a re-run cleans up, its failure the export's one-line error)."""
    atomic_write(path.parent, path.name, json.dumps(record.to_dict(), indent=1, sort_keys=True).encode())

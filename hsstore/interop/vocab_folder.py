"""The folder ``hsstore vocab-map`` writes into: new, empty, or holding vocab-maps of the same variant only.

A vocab-map writes five files; each is replaced whole, but five renames are not one. So the folder is held
(an exclusive lock) while they are written, every file is first written whole beside its name (a full disk
or a file-size limit fails there, and leaves the folder as it was: the earlier files and their record), and
the record ``vocab-map-N.json`` — what says the files belong together — is removed before the first file is
renamed into place and written after the last: a folder whose ``d2t-N.npy`` has no record is a run that did
not finish. A file the run would replace that no
record of the folder names (a user's ``token_freq.pt``), or a record of another variant (whose
``token_freq.pt`` would be overwritten), is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import xxhash

from hsstore.core.errors import WRITE_FIXES, BadInput, WriteFailed, write_cause
from hsstore.interop.formats.interface import PLACE_ERRORS, TMP_SUFFIX, atomic_write, write_failed
from hsstore.storage.fileio import write_file
from hsstore.storage.leases import Lease, lock_folder_alone

RECORD_GLOB = "vocab-map-*.json"


def record_name(size: int) -> str:
    return f"vocab-map-{size}.json"


def _records(root: Path) -> dict[str, dict]:
    """The vocab-map records in ``root`` by file name; BadInput for one that is not a vocab-map record."""
    out = {}
    for p in sorted(root.glob(RECORD_GLOB)):
        try:
            rec = json.loads(p.read_bytes()[: 1 << 20]) if p.is_file() and not p.is_symlink() else None
        except (ValueError, OSError):
            rec = None
        if not (isinstance(rec, dict) and isinstance(rec.get("files"), dict) and "variant" in rec):
            raise BadInput(f"{p} is not a vocab-map record hsstore wrote; choose another --out folder or move it")
        out[p.name] = rec
    return out


def hold_vocab_folder(root: Path, store: str, vid: str, names: list[str], size: int) -> Lease:
    """Create and lock ``root`` for a vocab-map of variant ``vid`` writing ``names``, after checking that no
    file it replaces is someone else's. The lease is held until the record is written (release it then)."""
    try:  # (write_vocab_map has checked that root is outside every store)
        root.mkdir(parents=True, exist_ok=True)
        lease = lock_folder_alone(str(root))
    except OSError as e:
        raise write_failed(root, e) from None
    if lease is None:
        raise BadInput(f"vocab-map folder {str(root)!r} is in use by another command right now (a vocab-map or an "
                       "export writing it, an import reading it); wait for it to finish, or choose another --out")
    try:
        records = _records(root)
        for name, rec in records.items():
            if rec.get("variant") != vid:
                raise BadInput(f"{root} holds a vocab-map of {rec.get('store')}#{rec.get('variant')} ({name}), not of "
                               f"{store}#{vid}; choose another --out folder")
        ours = {f for rec in records.values() for f in rec["files"]} | set(records)
        foreign = [n for n in names if os.path.lexists(root / n) and n not in ours]
        if foreign:
            raise BadInput(f"{root / foreign[0]} exists and no vocab-map record in {root} names it; hsstore does not "
                           "overwrite files it did not write — choose another --out folder or move it")
    except BaseException:
        lease.release()
        raise
    return lease


def write_together(root: Path, outputs: list[tuple[str, bytes]], record: str,
                   make_record: Callable[[dict[str, str]], bytes]) -> None:
    """Give the held folder ``root`` the files ``outputs`` and then their record ``record`` (from
    ``make_record(xxh3 of each file)``): all files are written whole under temporary names first, so a write
    that fails leaves every earlier file and record as they were; only then is the record removed, the files
    renamed into place and the new record written. Temporary files a killed run left are removed first."""
    for stale in root.glob(f".*{TMP_SUFFIX}"):  # (the folder is held: no live writer owns one)
        if stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    staged: list[tuple[str, str]] = []
    try:
        try:
            for name, data in outputs:
                staged.append((f".{name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}", name))
                write_file(str(root / staged[-1][0]), [data], exclusive=True)
        except OSError as e:
            path = root / staged[-1][1] if staged else root
            if e.errno in PLACE_ERRORS:
                raise write_failed(path, e) from None
            raise WriteFailed(f"writing {path} failed: {e.strerror or e}; the vocab-map folder is as it was (no file "
                              f"of it was replaced). {WRITE_FIXES[write_cause(e)]} and re-run the same command") from None
        _rename_in(root, staged, record)
    finally:
        for tmp, _ in staged:
            (root / tmp).unlink(missing_ok=True)
    atomic_write(root, record, make_record({name: xxhash.xxh3_128_hexdigest(data) for name, data in outputs}))


def _rename_in(root: Path, staged: list[tuple[str, str]], record: str) -> None:
    """The staged files renamed over their names, the record that vouched for the earlier ones removed first."""
    (root / record).unlink(missing_ok=True)  # the files are about to change: no record vouches for them
    for tmp, name in staged:
        try:
            os.replace(root / tmp, root / name)
        except OSError as e:
            raise WriteFailed(f"putting {root / name} in place failed: {e.strerror or e}; the vocab-map folder now "
                              "holds part of the new files and no record (hsstore takes it for unfinished): fix that "
                              "and re-run the same command") from None

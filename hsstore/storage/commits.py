"""Which units are committed: the one definition that readers, writers, verify and gc share.

A unit ``<uid>`` of variant ``<vid>`` is committed when ``variants/<vid>/commits/<uid>.json`` is a
readable commit record whose ``unit`` field is ``<uid>``. A record that cannot be read, or that names
another unit (renamed or copied by hand), commits nothing: readers refuse to serve the variant until it
is fixed, verify reports it, and gc still keeps every unit it names or is named after. A hidden file there
(.DS_Store and the like) is no record: verify reports it as a stray file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hsstore.core.errors import CorruptData
from hsstore.core.schema.store_records import CommitRecord
from hsstore.storage import layout
from hsstore.storage.backend import Backend
from hsstore.storage.fileio import MAX_RECORD_BYTES, parse_json


@dataclass(frozen=True)
class Commits:
    """A variant's commit records, judged: ``committed`` by unit id (ascending), ``bad`` as (key, why),
    ``protected``: every unit id a record names or is named after (gc never removes those)."""

    committed: dict[str, Any]  # CommitRecord, or what scan's ``keep`` made of it
    bad: list[tuple[str, str]]
    protected: frozenset[str]


def read_commit(io: Backend, vid: str, key: str) -> CommitRecord:
    """The record at commit key ``key`` if it commits the unit it is named after; CorruptData otherwise."""
    what = f"commit record {key}"
    k = layout.parse_key(key)
    if k.kind != "commit" or k.vid != vid:
        raise CorruptData(f"{what}: not a commit record key of variant {vid}")
    raw = io.get(key, cap=MAX_RECORD_BYTES)
    if raw is None:
        raise CorruptData(f"{what} vanished while being read")
    rec = CommitRecord.from_json(raw, what)  # typed straight from the bytes: no dict, depth fixed by the type
    if rec.unit != k.uid:
        raise CorruptData(
            f"{what} names unit {rec.unit!r}, not the unit {k.uid!r} it is named after (renamed or copied by "
            f"hand?); move it back to {layout.commit_key(vid, rec.unit) if layout.is_name(rec.unit) else '?'} "
            "or remove it"
        )
    return rec


def commit_keys(io: Backend, vid: str) -> list[str]:
    """Every key under the variant's commits/ (temporary files excluded), sorted; but hidden files (.DS_Store,
    ._NAME, .nfsXXXX: an operating system's litter; no hsstore name starts with a dot), which are no record: verify
    names them as stray files, and readers serve the variant."""
    return [k for k in io.list(layout.commits_prefix(vid)) if not k.rsplit("/", 1)[-1].startswith(".")]


def scan(
    io: Backend,
    vid: str,
    skip: set[str] | frozenset[str] = frozenset(),
    keep: Callable[[CommitRecord], Any] | None = None,
) -> Commits:
    """Judge every commit record of ``vid`` (keys in ``skip`` are left out: already seen by the caller);
    ``keep``: what to hold of each committed record, made as it is read (a reader's compact form, so the
    records of a large variant are never all in memory at once)."""
    committed: dict[str, Any] = {}
    bad: list[tuple[str, str]] = []
    protected: set[str] = set()
    for key in commit_keys(io, vid):
        if key in skip:
            continue
        k = layout.parse_key(key)
        if k.uid:
            protected.add(k.uid)
        try:
            rec = read_commit(io, vid, key)
        except CorruptData as e:
            bad.append((key, str(e)))
            named = _named_unit(io, key)
            if named:
                protected.add(named)
            continue
        committed[rec.unit] = rec if keep is None else keep(rec)
    return Commits(dict(sorted(committed.items())), bad, frozenset(protected))


def _named_unit(io: Backend, key: str) -> str | None:
    """The ``unit`` a record that fails judgement still names, if it can be read at all."""
    try:
        raw = io.get(key, cap=MAX_RECORD_BYTES)
        d = parse_json(raw, key) if raw is not None else None
    except CorruptData:
        return None
    unit = d.get("unit") if isinstance(d, dict) else None
    return unit if isinstance(unit, str) and layout.is_name(unit) else None

"""verify: every checksum, every committed sample readable, tokens match keys, states sane, no stray files."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hsstore.storage import layout
from hsstore.core.errors import CorruptData
from hsstore.storage.stats import layer_stats, problems
from hsstore.storage.store import Store

_UNIT_FILE = re.compile(r"^variants/([^/]+)/units/([^/]+)/(.+)$")
_KNOWN = (
    re.compile(r"^zarr\.json$"),
    re.compile(r"^variants/zarr\.json$"),
    re.compile(r"^variants/[^/]+/zarr\.json$"),
    re.compile(r"^variants/[^/]+/units/zarr\.json$"),
    re.compile(r"^variants/[^/]+/commits/[^/]+\.json$"),
    re.compile(r"^variants/[^/]+/builds/[^/]+\.json$"),
    re.compile(r"^builds/[0-9A-Za-z_.-]+/(r[0-9]+-(start|end)\.json|rows\.jsonl)$"),  # build lineage
)


def verify(store: Store, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Check the whole store; returns ``{"ok", "problems": [{"variant", "key", "unit", "what"}], ...}``."""
    found: list[dict[str, Any]] = []
    notes: list[str] = []
    checked = 0
    committed_files: set[str] = set()
    units_committed: set[tuple[str, str]] = set()

    def problem(vid: str | None, key: str | None, unit: str | None, what: str) -> None:
        found.append({"variant": vid, "key": key, "unit": unit, "what": what})

    for vid in store.variant_ids():
        reader = store.reader(vid, refresh=True)
        for ckey, why in reader.bad_commits:
            problem(vid, None, None, f"commit record {ckey} unreadable: {why}")
        owners: dict[str, list[str]] = {}
        for c in reader.commits:
            units_committed.add((vid, c.unit))
            prefix = layout.unit_prefix(vid, c.unit)
            committed_files.update(f"{prefix}/{rel}" for rel in c.files)
            for k, _, _ in c.samples:
                owners.setdefault(k, []).append(c.unit)
            try:
                reader.check_unit(c.unit, checksums=True)
            except CorruptData as e:
                for k, _, _ in c.samples:
                    problem(vid, k, c.unit, str(e))
                continue
            for k, off, n in c.samples:
                ref = reader.refs[k]
                if ref.unit != c.unit:
                    continue  # a duplicate written by a racing writer; the winner is checked
                try:
                    reader.read_tokens(ref)
                    for layer, t in zip(reader.record.all_layers, reader.read_layers(ref, reader.record.all_layers)):
                        bad = problems(layer_stats(t)) if n > 0 else ["empty sample"]
                        if bad:
                            problem(vid, k, c.unit, f"layer {layer}: {'; '.join(bad)}")
                except CorruptData as e:
                    problem(vid, k, c.unit, str(e))
                checked += 1
                if progress:
                    progress(n)
        dups = sum(1 for v in owners.values() if len(v) > 1)
        if dups:
            notes.append(f"variant {vid}: {dups} sample(s) committed by more than one unit (racing writers); "
                         "readers use the first unit, the rest is wasted space")
    uncommitted = 0
    for key in store.io.list(""):
        m = _UNIT_FILE.match(key)
        if m:
            if (m.group(1), m.group(2)) in units_committed:
                if key not in committed_files:
                    problem(m.group(1), None, m.group(2), f"file {key} was not recorded by the unit's commit")
            else:
                uncommitted += 1
            continue
        if not any(p.match(key) for p in _KNOWN):
            problem(None, None, None, f"file {key} was not written by hsstore")
    if uncommitted:
        notes.append(f"{uncommitted} file(s) of uncommitted units (a build in progress, or debris: `hsstore gc`)")
    return {"ok": not found, "samples_checked": checked, "problems": found, "notes": notes}



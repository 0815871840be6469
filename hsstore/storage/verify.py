"""verify: the whole tree against the format, every committed file's size and checksum (xxh3), every committed
sample readable with tokens matching its key and sane states.

The tree check asks hsstore.storage.layout what each key is: anything hsstore does not write (a stray
file, a symlink, a FIFO, socket or device, an executable, a directory the format has no
place for, non-JSON under builds/, a metadata document (zarr.json) that is not one, committed or not) is a problem, as is a committed unit whose record lists other files
than the format gives its layers, or whose samples do not tile its arrays exactly. Debris of writes that
never finished (files of uncommitted units, temporary files of cut-short puts) is a note, not a problem:
no reader looks at it, and ``hsstore gc`` removes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hsstore.core.dtypes import as_float32
from hsstore.core.errors import CorruptData, HsstoreError, StoreUnreachable
from hsstore.core.provenance_match import variant_id
from hsstore.core.schema.reports import Problem, VerifyReport
from hsstore.core.schema.store_records import CommitRecord
from hsstore.storage import layout
from hsstore.storage.fileio import parse_json
from hsstore.storage.reader import VariantReader
from hsstore.storage.sample_table import SampleRef
from hsstore.storage.stats import health_problems, problems
from hsstore.storage.store import Store, group_attributes

_ODD = {
    "symlink": "a symlink (hsstore writes none: a link can lead reads out of the store)",
    "fifo": "a FIFO",
    "socket": "a socket",
    "device": "a device file",
    "other": "a special file",
}


@dataclass
class Report:
    """Problems found so far, notes, and what was committed (for the tree check)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    committed: dict[tuple[str, str], CommitRecord] = field(default_factory=dict)
    damaged: dict[tuple[str, str], None] = field(default_factory=dict)  # committed units whose files fail checks
    checked: int = 0

    def add(self, what: str, vid: str | None = None, key: str | None = None, unit: str | None = None) -> None:
        for hint in (". Run `hsstore verify` to list them", ". Run `hsstore verify`", "; run `hsstore verify`"):
            what = what.removesuffix(hint)  # (a read's hint: this is verify)
        self.problems.append(Problem(variant=vid, key=key, unit=unit, what=what))

    def damage(self, e: CorruptData, vid: str, unit: str, key: str | None = None) -> None:
        """A committed unit's file failing its checks: a problem, and the unit is damaged."""
        self.add(str(e), vid, key, unit)
        self.damaged[(vid, unit)] = None


def verify(store: Store, progress: Callable[[int], None] | None = None, quarantine: bool = False) -> VerifyReport:
    """Check the whole store: every problem found (``ok`` when none), and notes on what is not damage;
    ``quarantine``: then take back the commit of each damaged unit (``take_back``)."""
    report = Report()
    try:
        vids = store.variant_ids()
    except StoreUnreachable:
        raise  # the network, not the data: one message, not a problem per sample
    except HsstoreError as e:
        report.add(str(e))
        vids = []
    for vid in vids:
        try:
            reader = store.reader(vid, refresh=True)
        except StoreUnreachable:
            raise
        except HsstoreError as e:
            report.add(str(e), vid)
            continue
        _verify_variant(reader, report, progress)
    _verify_tree(store, report)
    damaged = [f"{vid}/{uid}" for vid, uid in report.damaged]
    taken = [f"{vid}/{uid}" for vid, uid in report.damaged if take_back(store, vid, uid)] if quarantine else []
    return VerifyReport(
        ok=not report.problems,
        samples_checked=report.checked,
        problems=report.problems,
        notes=report.notes,
        damaged_units=damaged,
        quarantined=taken,
    )


def take_back(store: Store, vid: str, uid: str) -> bool:
    """Move unit ``uid``'s commit record to ``quarantine/`` (kept there as it was): its samples read as never
    built, so re-running the build that wrote them computes them again, and its files are debris for gc. False
    when the record is gone already. A kill between the two steps leaves the unit committed: run it again."""
    raw = store.io.get(layout.commit_key(vid, uid))
    if raw is None:
        return False
    store.io.put_if_absent(layout.quarantine_key(vid, uid), raw)  # (there already: an earlier run was cut short)
    store.io.remove(layout.commit_key(vid, uid))
    return True


def _verify_variant(reader: VariantReader, report: Report, progress: Callable[[int], None] | None) -> None:
    vid = reader.id
    if (hashed := variant_id(reader.record.provenance)) != vid:  # a note: a version that hashed other fields did too
        report.notes.append(
            f"variant {vid}: its provenance hashes to {hashed}, not its id: the record was edited after the states "
            "were made (what info and the selectors say of it may not be how they were computed), or written by "
            "an hsstore that hashed other fields"
        )
    for ckey, why in reader.bad_commits:
        report.add(f"commit record {ckey} unreadable (it commits nothing): {why}", vid)
        uid = layout.parse_key(ckey).uid
        if uid is not None and ckey == layout.commit_key(vid, uid):  # (readers refuse the variant while it is there)
            report.damaged[(vid, uid)] = None
    for head in reader.table.headers:
        report.committed[(vid, head.unit)] = head  # (its files, for the tree check: not its sample list)
        try:
            reader.check_unit(head.unit, checksums=True)
        except CorruptData as e:
            for k, _, _ in reader.units[head.unit].samples:
                report.damage(e, vid, head.unit, k)
            continue
        ranges = UnitRanges(reader.record.all_layers)
        for ref in reader.unit_refs(head.unit):  # a duplicate of a racing writer is skipped; the winner is read
            _verify_sample(reader, ref, report, ranges)
            if progress:
                progress(ref.length)
        _check_unit_ranges(reader, head.unit, ranges, report)
    dups = reader.table.duplicated_keys
    if dups:
        report.notes.append(
            f"variant {vid}: {dups} sample(s) committed by more than one unit (racing writers); "
            "readers use the first unit, the rest is wasted space"
        )


class UnitRanges:
    """Per layer, the value count, min and max of a unit's states as verify reads them (NaN and Inf read as 0, as
    the writer's health stats count them): against the commit record's, they tell whether the files hold the
    states committed. A file swapped for another of its size and layout (another layer's, unit's or variant's,
    with its record's sizes and checksums fixed up to match) holds other values."""

    def __init__(self, layers: list[int]) -> None:
        self.n = dict.fromkeys(layers, 0)
        self.lo = dict.fromkeys(layers, math.inf)
        self.hi = dict.fromkeys(layers, -math.inf)

    def add(self, layer: int, x: np.ndarray, span: tuple[Any, Any] | None = None) -> None:
        """Add ``x``'s values (``span``: its min and max, taken already)."""
        if x.size == 0:
            return
        lo, hi = span if span is not None else (x.min(), x.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):
            finite = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
            lo, hi = finite.min(), finite.max()
        self.n[layer] += int(x.size)
        self.lo[layer], self.hi[layer] = min(self.lo[layer], float(lo)), max(self.hi[layer], float(hi))


def _check_unit_ranges(reader: VariantReader, uid: str, ranges: UnitRanges, report: Report) -> None:
    """Damage the unit whose states' count, min or max are not those its commit record holds (variants stored as
    computed: an FP8 variant's record holds the states' stats before quantization)."""
    c = reader.units[uid]
    if reader.record.stored_precision or (reader.id, uid) in report.damaged:  # (a damaged sample left them partial)
        return
    served = {r.key for r in reader.unit_refs(uid)}
    try:
        for key, off, n in c.samples:  # (a racing writer's duplicate is not served, but the record counted it)
            for i in ranges.n if key not in served else ():
                x = reader.read_array(SampleRef(key, uid, off, n), layout.layer_array(i))
                ranges.add(i, as_float32(x, reader.record.dtype))
    except CorruptData as unreadable:
        report.damage(unreadable, reader.id, uid)
        return
    for i in ranges.n:
        rec = c.stats.get(str(i))
        if rec is None or (rec.n, rec.min, rec.max) == (ranges.n[i], ranges.lo[i], ranges.hi[i]) or not rec.n:
            continue
        replaced = CorruptData(
            f"unit {uid} of variant {reader.id}: layer {i} holds {ranges.n[i]} values in [{ranges.lo[i]:.6g}, "
            f"{ranges.hi[i]:.6g}], its commit record {rec.n} in [{rec.min:.6g}, {rec.max:.6g}]: its files are not "
            "the states committed (swapped or replaced)"
        )
        for key, _, _ in c.samples:
            report.damage(replaced, reader.id, uid, key)
        return


def _layer_problems(
    reader: VariantReader, ref: SampleRef, layers: list[int], ranges: UnitRanges | None = None
) -> list[list[str]]:
    """What is wrong with each layer of one sample: states stored as computed are read and judged with
    numpy alone (min and max decide unless a value is NaN or Inf; added to ``ranges``); FP8 variants are
    dequantized first (the one path that needs torch)."""
    rec = reader.record
    if rec.stored_precision:
        from hsstore.storage.stats import layer_stats

        return [problems(layer_stats(t)) for t in reader.read_layers(ref, layers)]
    out = []
    for i in layers:
        x = as_float32(reader.read_array(ref, layout.layer_array(i)), rec.dtype)
        span = (x.min(), x.max()) if x.size else None  # one pass each, for the health check and the unit's range
        if ranges is not None:
            ranges.add(i, x, span)
        out.append(health_problems(x, span))
    return out


def _verify_sample(reader: VariantReader, ref: SampleRef, report: Report, ranges: UnitRanges | None = None) -> None:
    layers = reader.record.all_layers
    try:
        reader.read_tokens(ref)
        for layer, found in zip(layers, _layer_problems(reader, ref, layers, ranges)):
            bad = found if ref.length > 0 else ["empty sample"]
            if bad:
                report.add(f"layer {layer}: {'; '.join(bad)}", reader.id, ref.key, ref.unit)
    except CorruptData as e:
        report.damage(e, reader.id, ref.unit, ref.key)
    report.checked += 1


def _verify_tree(store: Store, report: Report) -> None:
    """Every entry of the store against the format."""
    uncommitted = temporary = 0
    try:
        entries = list(store.io.entries())
    except StoreUnreachable:
        raise
    except HsstoreError as e:
        report.add(f"the store's tree cannot be listed: {e}")
        return
    executable = 0
    for entry in entries:
        if entry.kind == "dir":
            if layout.parse_key(entry.key).kind == "temp":
                temporary += 1
            elif not layout.is_dir_key(entry.key):
                report.add(f"directory {entry.key} has no place in the format (not written by hsstore)")
            continue
        if entry.kind in _ODD:
            report.add(f"{entry.key} is {_ODD[entry.kind]}; hsstore writes only regular files")
            continue
        executable += entry.executable  # (a mode bit changes no byte a reader reads: a note, not damage)
        if layout.parse_key(entry.key).kind == "temp":
            temporary += 1
            continue
        uncommitted += _verify_file(store, entry.key, report)
    if temporary:
        report.notes.append(
            f"{temporary} temporary file(s) of writes that never finished (a write in progress, or "
            "debris of a killed one: `hsstore gc` removes them)"
        )
    if uncommitted:
        report.notes.append(
            f"{uncommitted} file(s) of uncommitted units (a build in progress, or debris: `hsstore gc`)"
        )
    if executable:
        report.notes.append(
            f"{executable} file(s) are executable, which hsstore never makes them (a `chmod -R`, or a mount that "
            "marks every file so); their bytes are checked as any file's"
        )


def _verify_file(store: Store, key: str, report: Report) -> int:
    """Problems of one regular file; returns 1 if it belongs to an uncommitted unit."""
    k = layout.parse_key(key)
    if k.kind == "unknown":
        report.add(f"file {key} was not written by hsstore", k.vid)
    elif k.kind == "unit-file":
        vid, uid, rel = k.vid, k.uid, k.rel
        if vid is None or uid is None or rel is None:
            raise AssertionError(f"{key}: parse_key names the variant, unit and file of every unit file")
        c = report.committed.get((vid, uid))
        if rel == layout.META or rel.endswith("/" + layout.META):  # whatever the commit state
            _verify_document(store, key, "group" if rel == layout.META else "array", report, k, c is not None)
        if c is None:
            return 1
        if rel not in c.files:
            report.add(f"file {key} was not recorded by the unit's commit", k.vid, None, k.uid)
    elif k.kind in ("build", "lineage", "label", "model"):  # (a quarantined record is kept as it was: damaged too)
        _verify_document(store, key, None, report, k, True)
    elif k.kind in ("root-meta", "variants-meta", "variant-meta", "units-meta"):
        _verify_document(store, key, "group", report, k, True)
    return 0


def _verify_document(store: Store, key: str, node: str | None, report: Report, k: layout.Key, whole: bool) -> None:
    """A problem naming ``key`` when it is not a JSON document (``node``: a zarr group or array document). An
    empty one of an uncommitted unit (``whole`` False) is a write in progress, not damage."""
    try:
        raw = store.io.get(key) or b""
        if not raw and not whole:
            return
        meta = parse_json(raw, key)
        if node is not None and (
            not isinstance(meta, dict) or meta.get("node_type") != node or meta.get("zarr_format") != 3
        ):
            raise CorruptData(
                f"{key}: not a zarr v3 {node} document (node_type "
                f"{meta.get('node_type') if isinstance(meta, dict) else type(meta).__name__!r})"
            )
        if node == "group":
            group_attributes(raw, key)
    except CorruptData as e:
        report.add(str(e) if key in str(e) else f"{key}: {e}", k.vid, None, k.uid)

"""verify: the whole tree against the format, every committed file's size and crc32c, every committed
sample readable with tokens matching its key and sane states.

The tree check asks hsstore.storage.layout what each key is: anything hsstore does not write (a stray
file, a symlink, a FIFO, socket or device, an executable, a directory the format has no
place for, non-JSON under builds/) is a problem, as is a committed unit whose record lists other files
than the format gives its layers, or whose samples do not tile its arrays exactly. Debris of writes that
never finished (files of uncommitted units, temporary files of cut-short puts) is a note, not a problem:
no reader looks at it, and ``hsstore gc`` removes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hsstore.core.dtypes import as_float32
from hsstore.core.errors import CorruptData, HsstoreError, StoreUnreachable
from hsstore.core.schema.store_records import CommitRecord
from hsstore.core.schema.verify_report import Problem, VerifyReport
from hsstore.storage import layout
from hsstore.storage.reader import VariantReader
from hsstore.storage.metadata_io import parse_json
from hsstore.storage.stats import array_stats, problems
from hsstore.storage.store import Store, group_attributes

_ODD = {"symlink": "a symlink (hsstore writes none: a link can lead reads out of the store)", "fifo": "a FIFO",
        "socket": "a socket", "device": "a device file", "other": "a special file"}


@dataclass
class Report:
    """Problems found so far, notes, and what was committed (for the tree check)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    committed: dict[tuple[str, str], CommitRecord] = field(default_factory=dict)
    checked: int = 0

    def add(self, what: str, vid: str | None = None, key: str | None = None, unit: str | None = None) -> None:
        self.problems.append(Problem(variant=vid, key=key, unit=unit, what=what))

    def for_samples(self, c: CommitRecord, vid: str, what: str) -> None:
        for k, _, _ in c.samples:
            self.add(what, vid, k, c.unit)


def verify(store: Store, progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check the whole store: every problem found (``ok`` when none), and notes on what is not damage."""
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
    return VerifyReport(ok=not report.problems, samples_checked=report.checked, problems=report.problems,
                        notes=report.notes)


def _verify_variant(reader: VariantReader, report: Report, progress: Callable[[int], None] | None) -> None:
    vid = reader.id
    for ckey, why in reader.bad_commits:
        report.add(f"commit record {ckey} unreadable (it commits nothing): {why}", vid)
    owners: dict[str, int] = {}
    for c in reader.commits:
        report.committed[(vid, c.unit)] = c
        for k, _, _ in c.samples:
            owners[k] = owners.get(k, 0) + 1
        try:
            reader.check_unit(c.unit, checksums=True)
        except CorruptData as e:
            report.for_samples(c, vid, str(e))
            continue
        for k, _, n in c.samples:
            if reader.refs[k].unit == c.unit:  # a duplicate of a racing writer is skipped; the winner is read
                _verify_sample(reader, reader.refs[k], report)
                if progress:
                    progress(n)
    dups = sum(1 for n in owners.values() if n > 1)
    if dups:
        report.notes.append(f"variant {vid}: {dups} sample(s) committed by more than one unit (racing writers); "
                            "readers use the first unit, the rest is wasted space")


def _layer_health(reader: VariantReader, ref: Any, layers: list[int]) -> list[dict[str, float]]:
    """Health statistics of each layer of one sample: states stored as computed are read with numpy
    alone; FP8 variants are dequantized first (the one path that needs torch)."""
    rec = reader.record
    if rec.stored_precision:
        from hsstore.storage.stats import layer_stats

        return [layer_stats(t) for t in reader.read_layers(ref, layers)]
    return [array_stats(as_float32(reader.read_array(ref, layout.layer_array(i)), rec.dtype)) for i in layers]


def _verify_sample(reader: VariantReader, ref: Any, report: Report) -> None:
    layers = reader.record.all_layers
    try:
        reader.read_tokens(ref)
        for layer, stats in zip(layers, _layer_health(reader, ref, layers)):
            bad = problems(stats) if ref.length > 0 else ["empty sample"]
            if bad:
                report.add(f"layer {layer}: {'; '.join(bad)}", reader.id, ref.key, ref.unit)
    except CorruptData as e:
        report.add(str(e), reader.id, ref.key, ref.unit)
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
    for e in entries:
        if e.kind == "dir":
            if layout.parse_key(e.key).kind == "temp":
                temporary += 1
            elif not layout.is_dir_key(e.key):
                report.add(f"directory {e.key} has no place in the format (not written by hsstore)")
            continue
        if e.kind in _ODD:
            report.add(f"{e.key} is {_ODD[e.kind]}; hsstore writes only regular files")
            continue
        if e.executable:
            report.add(f"file {e.key} is executable; hsstore writes none")
        if layout.parse_key(e.key).kind == "temp":
            temporary += 1
            continue
        uncommitted += _verify_file(store, e.key, report)
    if temporary:
        report.notes.append(f"{temporary} temporary file(s) of writes that never finished (a write in progress, or "
                            "debris of a killed one: `hsstore gc` removes them)")
    if uncommitted:
        report.notes.append(f"{uncommitted} file(s) of uncommitted units (a build in progress, or debris: `hsstore gc`)")


def _verify_file(store: Store, key: str, report: Report) -> int:
    """Problems of one regular file; returns 1 if it belongs to an uncommitted unit."""
    k = layout.parse_key(key)
    if k.kind == "unknown":
        report.add(f"file {key} was not written by hsstore", k.vid)
    elif k.kind == "unit-file":
        c = report.committed.get((k.vid, k.uid))
        if c is None:
            return 1
        if k.rel not in c.files:
            report.add(f"file {key} was not recorded by the unit's commit", k.vid, None, k.uid)
    elif k.kind in ("build", "lineage", "label", "model", "variants-meta", "units-meta"):
        try:
            raw = store.io.get(key)
            parse_json(raw or b"", key) if k.kind in ("build", "lineage", "label", "model") else group_attributes(raw or b"", key)
        except CorruptData as e:
            report.add(str(e), k.vid)
    return 0

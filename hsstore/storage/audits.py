"""Audit records: what ``hsstore import --audit N`` found, kept beside the variant's build and import
records (``variants/<vid>/builds/audit-<time>.json``) so ``hsstore info`` can say that a cache was
audited, when, against which model, and with what result. JSON only; written atomically."""

from __future__ import annotations

import datetime as _dt
import json
import uuid

from hsstore.core.errors import CorruptData
from hsstore.core.schema.diff_report import CheckReport
from hsstore.core.schema.info_report import AuditSummary
from hsstore.core.schema.record import or_none
from hsstore.storage import layout
from hsstore.storage.store import Store

PREFIX = "audit-"


def record_audit(store: Store, vid: str, report: CheckReport) -> AuditSummary:
    """Keep the summary of an audit report (the fields of ``hsstore check --json`` an AuditSummary has) with
    the time."""
    stamp = _dt.datetime.now(_dt.timezone.utc)
    rec = AuditSummary(kind="audit", audited_at=stamp.isoformat(timespec="seconds"), model=report.model,
                       model_fingerprint=report.model_fingerprint, samples=report.samples,
                       population=or_none(report.population), verdict=report.verdict,
                       verdict_kind=report.verdict_kind, defects=report.defects,
                       defective_samples=or_none(report.defective_samples),
                       defect_rate_upper=or_none(report.defect_rate_upper), bound=or_none(report.bound),
                       recompute=or_none(report.recompute), assumed=report.assumed,
                       restatement=(None if or_none(report.restatement) is None else report.restatement.to_dict()))
    name = f"{PREFIX}{stamp.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    store.io.put_atomic(layout.build_key(vid, name), json.dumps(rec.to_dict(), sort_keys=True).encode())
    return rec


def audits(store: Store, vid: str) -> list[AuditSummary]:
    """The variant's audit records, oldest first (an unreadable one is left out)."""
    out = []
    for key in sorted(store.io.list(layout.builds_prefix(vid))):
        if not key.rsplit("/", 1)[-1].startswith(PREFIX):
            continue
        try:
            rec = AuditSummary.from_json(store.io.get(key) or b"", key)
        except CorruptData:
            continue
        if rec.kind == "audit":
            out.append(rec)
    return out


def audit_line(a: AuditSummary) -> str:
    """One audit record in words: when, against which model, what it found and what that bounds."""
    return (f"audited {a.audited_at} against {a.model} ({str(a.model_fingerprint)[:16]}): {a.verdict}; "
            f"{a.bound}")


def import_gaps(store: Store, vid: str) -> list[str]:
    """What finished imports into the variant left out (files skipped as unreadable or misaligned, rows
    without a states file), in words: an audit of the variant cannot see them."""
    out = []
    for key in sorted(store.io.list(layout.builds_prefix(vid))):
        name = key.rsplit("/", 1)[-1]
        if not name.startswith("import-"):
            continue
        try:
            rec = json.loads(store.io.get(key) or b"")
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("kind") != "import":
            continue
        bad, missing = int(rec.get("n_skipped_bad", 0)), int(rec.get("n_missing", 0))
        if bad or missing:
            out.append(f"the import of {rec.get('path')} ({rec.get('finished_at')}) left out {bad} file(s) it could not "
                       f"read or whose states do not line up with their tokens (--skip-bad) and {missing} row(s) "
                       "without a states file: they are not in this variant, so this audit cannot judge them")
    return out

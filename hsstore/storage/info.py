"""What ``hsstore info`` reports: per variant, provenance, samples, tokens, bytes, compression and health."""

from __future__ import annotations

import datetime as _dt
import json
import uuid
from typing import Any

from hsstore.core.dtypes import STORED
from hsstore.core.errors import CorruptData
from hsstore.core.provenance_match import identified, model_fingerprint, model_name, same_model
from hsstore.core.schema.record import UNSET, UnsetType, or_none
from hsstore.core.schema.reports import (
    AuditSummary,
    CheckReport,
    GenerationSummary,
    ModelGroup,
    StorageReport,
    StoreInfo,
    VariantInfo,
)
from hsstore.core.selectors import Apart
from hsstore.storage import layout
from hsstore.storage.reader import StoreLike, VariantReader
from hsstore.storage.stats import summary
from hsstore.storage.store import Store

# --- Audit records: what ``hsstore import --audit N`` found, kept beside the variant's build and import

PREFIX = "audit-"


def record_audit(store: Store, vid: str, report: CheckReport) -> AuditSummary:
    """Keep the summary of an audit report (the fields of ``hsstore check --json`` an AuditSummary has) with
    the time."""
    stamp = _dt.datetime.now(_dt.UTC)
    restatement = or_none(report.restatement)
    rec = AuditSummary(
        kind="audit",
        audited_at=stamp.isoformat(timespec="seconds"),
        model=report.model,
        model_fingerprint=report.model_fingerprint,
        samples=report.samples,
        population=or_none(report.population),
        verdict=report.verdict,
        verdict_kind=report.verdict_kind,
        defects=report.defects,
        defective_samples=or_none(report.defective_samples),
        defect_rate_upper=or_none(report.defect_rate_upper),
        bound=or_none(report.bound),
        recompute=or_none(report.recompute),
        assumed=report.assumed,
        restatement=None if restatement is None else restatement.to_dict(),
    )
    name = f"{PREFIX}{stamp.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    store.io.put_atomic(layout.build_key(vid, name), json.dumps(rec.to_dict(), sort_keys=True).encode())
    return rec


def audits(store: StoreLike, vid: str) -> list[AuditSummary]:
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
    return f"audited {a.audited_at} against {a.model} ({str(a.model_fingerprint)[:16]}): {a.verdict}; {a.bound}"


def import_gaps(store: StoreLike, vid: str) -> list[str]:
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
            out.append(
                f"the import of {rec.get('path')} ({rec.get('finished_at')}) left out {bad} file(s) it could not "
                f"read or whose states do not line up with their tokens (--skip-bad) and {missing} row(s) "
                "without a states file: they are not in this variant, so this audit cannot judge them"
            )
    return out


def store_info(store: Store) -> StoreInfo:
    """The store and every variant in it (what ``hsstore info`` prints, as text or ``--json``)."""
    readers = [store.reader(vid) for vid in store.variant_ids()]
    provs = {r.id: r.record.provenance for r in readers}
    apart, labels = Apart(provs), store.labels()
    variants = [
        variant_info(store, r, dict(apart.fewest(r.id) or [])).replace(
            label=labels.get(r.id), selector=apart.selector(r.id, labels), model=model_name(provs[r.id])
        )
        for r in readers
    ]
    models = _models(provs)
    order = {vid: i for i, g in enumerate(models) for vid in g.variants}
    return StoreInfo(
        format_version=store.format_version,
        location=store.location,
        variants=sorted(variants, key=lambda v: order[v.id]),
        models=models,
        generations=generations(store),
    )


def _models(provs: dict[str, dict[str, Any]]) -> list[ModelGroup]:
    """The variants grouped by the model they are of."""
    groups: list[tuple[dict[str, Any], list[str]]] = []
    # models known by more than their shape first; a shape-only variant (an import given no model) joins the
    # one known model of its shape, else a group of its own: it never joins two models into one
    for vid, p in sorted(provs.items(), key=lambda kv: not identified(kv[1])):
        fits = [g for g in groups if same_model(g[0], p)]
        known = [g for g in fits if identified(g[0])]
        group = (
            (fits[0] if fits else None)
            if identified(p)
            else (known[0] if len(known) == 1 else next((g for g in fits if not identified(g[0])), None))
        )
        if group is None:
            groups.append((p, [vid]))
        else:
            group[1].append(vid)
    return [ModelGroup(model=model_name(p), fingerprint=model_fingerprint(p), variants=v) for p, v in groups]


def kernel_set(kernels: dict[str, str] | None) -> str:
    """A reply's kernels in one line (``chunk_gated_delta_rule=fla causal_conv1d=fla attention=sdpa``); a server's
    replies, and those of builds before kernels were recorded: "not recorded"."""
    return " ".join(f"{k}={v}" for k, v in kernels.items()) if kernels else "not recorded"


def generations(store: Store) -> list[GenerationSummary]:
    """Every regenerating build's ledger, summed up (hsstore.capture.generate.regenerate writes them)."""
    from hsstore.storage import layout

    out = []
    for key in sorted(k for k in store.io.list("builds/") if layout.parse_key(k).kind == "lineage-ledger"):
        build_id = key.split("/")[1]
        recs = [json.loads(x) for x in (store.io.get(key) or b"").decode().splitlines() if x.strip()]
        finish: dict[str, int] = {}
        for r in recs:
            finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
        out.append(
            GenerationSummary(
                build_id=build_id,
                replies=len(recs),
                reused=sum(r.get("generated_by") != build_id for r in recs),
                dropped=sum(r.get("sample_key") is None for r in recs),
                finish=finish,
                prompt_tokens=sum(r["prompt_tokens"] for r in recs),
                reply_tokens=sum(r["reply_tokens"] for r in recs),
                engines=sorted({f"{r['engine']} {r['engine_version']}" for r in recs}),
                kernels=sorted({kernel_set(r.get("kernels")) for r in recs}),
            )
        )
    return out


def variant_info(store: Store, r: VariantReader, distinguished_by: dict[str, str]) -> VariantInfo:
    """One variant: ``distinguished_by`` are the fewest fields that tell it from the store's others."""
    vid = r.id
    files = sum(sum(c.files.values()) for c in r.commits)
    rec = r.record
    raw = sum(c.n_tokens for c in r.commits) * rec.hidden_size * STORED[rec.dtype].itemsize * len(rec.all_layers)
    storage: StorageReport | UnsetType = UNSET
    if rec.stored_precision:
        from hsstore.storage.convert import storage_report

        report = storage_report(store, vid)  # (None only for a variant stored as computed: not this one)
        storage = UNSET if report is None else report
    return VariantInfo(
        id=vid,
        provenance=rec.provenance,
        distinguished_by=distinguished_by,
        n_samples=len(r.refs),
        n_tokens=r.n_tokens,
        n_units=len(r.commits),
        bytes=files,
        raw_state_bytes=raw,
        compression_ratio=(raw / files) if files else None,
        codec=rec.codec,
        dtype=rec.dtype,
        hidden_size=rec.hidden_size,
        layers=rec.layers,
        health={str(k): summary(v) for k, v in r.stats().items()},
        unreadable_commits=len(r.bad_commits),
        precision=rec.stored_precision,
        audits=audits(store, vid),  # hsstore import --audit N: when, against what, what it found
        storage=storage,
    )

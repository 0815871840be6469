"""What ``hsstore info`` reports: per variant, provenance, samples, tokens, bytes, compression and health."""

from __future__ import annotations

from hsstore.core.distinguish import Apart
from hsstore.core.provenance_match import model_fingerprint, model_name, same_model
from hsstore.core.dtypes import STORED
import json

from hsstore.core.schema.info_report import GenerationSummary, ModelGroup, StoreInfo, VariantInfo
from hsstore.core.schema.record import UNSET
from hsstore.storage.audits import audits
from hsstore.storage.stats import summary
from hsstore.storage.store import Store, VariantReader


def store_info(store: Store) -> StoreInfo:
    """The store and every variant in it (what ``hsstore info`` prints, as text or ``--json``)."""
    readers = [store.reader(vid) for vid in store.variant_ids()]
    provs = {r.id: r.record.provenance for r in readers}
    apart, labels = Apart(provs), store.labels()
    variants = [variant_info(store, r, dict(apart.fewest(r.id) or [])).replace(
        label=labels.get(r.id), selector=apart.selector(r.id, labels), model=model_name(provs[r.id])) for r in readers]
    models = _models(provs)
    order = {vid: i for i, g in enumerate(models) for vid in g.variants}
    return StoreInfo(format_version=store.format_version, location=store.location,
                     variants=sorted(variants, key=lambda v: order[v.id]), models=models,
                     generations=generations(store))


def _models(provs: dict) -> list[ModelGroup]:
    """The variants grouped by the model they are of."""
    groups: list[tuple[dict, list[str]]] = []
    for vid, p in provs.items():
        group = next((g for g in groups if same_model(g[0], p)), None)
        if group is None:
            groups.append((p, [vid]))
        else:
            group[1].append(vid)
    return [ModelGroup(model=model_name(p), fingerprint=model_fingerprint(p), variants=v) for p, v in groups]


def generations(store: Store) -> list[GenerationSummary]:
    """Every regenerating build's ledger, summed up (hsstore.capture.generate.ledger writes them)."""
    from hsstore.storage import layout

    out = []
    for key in sorted(k for k in store.io.list("builds/") if layout.parse_key(k).kind == "lineage-ledger"):
        build_id = key.split("/")[1]
        recs = [json.loads(x) for x in (store.io.get(key) or b"").decode().splitlines() if x.strip()]
        finish: dict[str, int] = {}
        for r in recs:
            finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
        out.append(GenerationSummary(
            build_id=build_id, replies=len(recs), reused=sum(r.get("generated_by") != build_id for r in recs),
            dropped=sum(r.get("sample_key") is None for r in recs), finish=finish,
            prompt_tokens=sum(r["prompt_tokens"] for r in recs), reply_tokens=sum(r["reply_tokens"] for r in recs),
            engines=sorted({f"{r['engine']} {r['engine_version']}" for r in recs})))
    return out


def variant_info(store: Store, r: VariantReader, distinguished_by: dict[str, str]) -> VariantInfo:
    """One variant: ``distinguished_by`` are the fewest fields that tell it from the store's others."""
    vid = r.id
    files = sum(sum(c.files.values()) for c in r.commits)
    rec = r.record
    raw = sum(c.n_tokens for c in r.commits) * rec.hidden_size * STORED[rec.dtype].itemsize * len(rec.all_layers)
    storage = UNSET
    if rec.stored_precision:
        from hsstore.storage.fp8_report import storage_report

        storage = storage_report(store, vid)
    return VariantInfo(
        id=vid, provenance=rec.provenance, distinguished_by=distinguished_by, n_samples=len(r.refs),
        n_tokens=r.n_tokens, n_units=len(r.commits), bytes=files, raw_state_bytes=raw,
        compression_ratio=(raw / files) if files else None, codec=rec.codec, dtype=rec.dtype,
        hidden_size=rec.hidden_size, layers=rec.layers, health={str(k): summary(v) for k, v in r.stats().items()},
        unreadable_commits=len(r.bad_commits), precision=rec.stored_precision,
        audits=audits(store, vid),  # hsstore import --audit N: when, against what, what it found
        storage=storage,
    )

"""What ``hsstore info`` reports: per variant, provenance, samples, tokens, bytes, compression and health."""

from __future__ import annotations

from hsstore.core.distinguish import distinguishing
from hsstore.core.dtypes import STORED
from hsstore.core.schema.info_report import StoreInfo, VariantInfo
from hsstore.core.schema.record import UNSET
from hsstore.storage.audits import audits
from hsstore.storage.stats import summary
from hsstore.storage.store import Store, VariantReader


def store_info(store: Store) -> StoreInfo:
    """The store and every variant in it (what ``hsstore info`` prints, as text or ``--json``)."""
    readers = [store.reader(vid) for vid in store.variant_ids()]
    apart = distinguishing({r.id: r.record.provenance for r in readers})
    return StoreInfo(format_version=store.format_version, location=store.location,
                     variants=[variant_info(store, r, apart[r.id]) for r in readers])


def variant_info(store: Store, r: VariantReader, distinguished_by: dict[str, str]) -> VariantInfo:
    """One variant: ``distinguished_by`` are the fields that tell it from those sharing its description."""
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

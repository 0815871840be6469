"""What ``hsstore info`` reports: per variant, provenance, samples, tokens, bytes, compression and health."""

from __future__ import annotations

from typing import Any

from hsstore.core.dtypes import STORED
from hsstore.storage.audits import audits
from hsstore.storage.stats import summary
from hsstore.storage.store import Store


def info_dict(store: Store) -> dict[str, Any]:
    """What ``hsstore info --json`` prints."""
    out: dict[str, Any] = {"format_version": store.format_version, "location": store.location, "variants": []}
    for vid in store.variant_ids():
        r = store.reader(vid)
        files = sum(sum(c.files.values()) for c in r.commits)
        rec = r.record
        raw = sum(c.n_tokens for c in r.commits) * rec.hidden_size * STORED[rec.dtype].itemsize * len(rec.all_layers)
        out["variants"].append(
            {
                "id": vid,
                "provenance": rec.provenance,
                "n_samples": len(r.refs),
                "n_tokens": r.n_tokens,
                "n_units": len(r.commits),
                "bytes": files,
                "raw_state_bytes": raw,
                "compression_ratio": (raw / files) if files else None,
                "codec": rec.codec,
                "dtype": rec.dtype,
                "hidden_size": rec.hidden_size,
                "layers": rec.layers,
                "health": {str(k): summary(v) for k, v in r.stats().items()},
                "unreadable_commits": len(r.bad_commits),
                "precision": rec.stored_precision,  # null: stored as computed (raw_state_bytes: computed dtype)
                "audits": audits(store, vid),  # hsstore import --audit N: when, against what, what it found
            }
        )
        if rec.stored_precision:
            from hsstore.storage.fp8_report import storage_report

            out["variants"][-1]["storage"] = storage_report(store, vid)
    return out

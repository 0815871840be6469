"""The report of an import that restores an exported variant's provenance (ImportReport, docs/json.md)."""

from __future__ import annotations

from pathlib import Path

from interop_files import TOKENIZER

from hsstore import Store
from hsstore.core.schema.reports import ImportReport
from hsstore.interop import exporter, importer
from hsstore.interop.exporter import ExportRequest
from hsstore.interop.imported_provenance import tokenizer_identity
from hsstore.interop.importer import ImportRequest
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import LAYERS, make_samples, make_states, provenance


def test_a_restored_provenance_without_a_capture_point_reports_capture_unknown(tmp_path: Path):
    """A variant whose provenance records no ``recipe.capture`` (a store written before it was recorded),
    exported and imported again: the import restores that provenance, and its report says ``capture:
    "unknown"``. Before, the report's capture was UNSET, so ``--json`` left out a required key (and the
    document did not decode as an ImportReport)."""
    fp = tokenizer_identity(TOKENIZER)[0]["fingerprint"]
    prov = provenance(tok=fp)
    prov["recipe"]["model"]["hidden_size"] = 16
    store = Store.create(str(tmp_path / "a.zarr"))
    vid = store.create_variant(prov, LAYERS, 16, "bf16", "zstd", 64)
    samples = make_samples([5, 7, 9], tok=fp)
    UnitWriter(store, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2]))
    exporter.export_cache(ExportRequest(str(tmp_path / "a.zarr"), "specforge", str(tmp_path / "out")))
    r = importer.import_cache(
        ImportRequest("specforge", str(tmp_path / "out"), str(tmp_path / "b.zarr"), tokenizer=TOKENIZER, num_layers=4)
    )
    assert r.provenance == "restored"
    assert r.capture == "unknown"
    assert ImportReport.from_dict(r.to_dict(), "the report").capture == "unknown"  # (what --json prints)

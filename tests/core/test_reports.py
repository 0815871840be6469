"""import, export, vocab-map, env, label and check_live_model return typed records (not dicts), and their
``--json`` is the record's dict: the keys docs/json.md documents for the command, each value as the record
holds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import REPO, run_cli

from hsstore.core.schema.record import Record
from hsstore.core.schema.reports import (
    EnvReport,
    ExportReport,
    ImportReport,
    LiveFingerprint,
    VocabMapReport,
)

MODEL = "builtin:tiny-qwen3_5"
DOC = (REPO / "docs" / "json.md").read_text()


def _documented(command: str) -> set[str]:
    """The top-level keys docs/json.md lists for ``command``'s JSON (its bullet: `- `CMD --json`...`)."""
    m = re.search(rf"^- `{re.escape(command)}[^`]*`(.*?)(?=^- |^\n)", DOC, re.S | re.M)
    assert m, f"docs/json.md documents no JSON for {command}"
    body, depth, top, key = m.group(1), 0, set(), ""
    for quoted in re.finditer(r'[{}]|"([a-z_<>]+)"', body):  # keys at the document's first level of braces
        if quoted.group(0) == "{":
            depth += 1
        elif quoted.group(0) == "}":
            depth -= 1
        elif depth == 1 and (key := quoted.group(1)):
            top.add(key)
    return top


def _json(*args: str) -> dict:
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def _same(doc: dict, record: Record, cls: type[Record], command: str, optional: set[str] = frozenset(),
          varying: set[str] = frozenset()) -> None:
    """``record`` is a ``cls``; ``doc`` (the CLI's --json) has the documented keys; both hold the same fields,
    of the same values but for ``varying`` ones (and the time taken)."""
    assert isinstance(record, cls) and not isinstance(record, dict)
    documented = _documented(command)
    assert set(doc) <= documented and documented - set(doc) <= optional, (sorted(doc), sorted(documented))
    mine = record.to_dict()
    assert set(mine) <= set(doc) and set(doc) - set(mine) <= optional
    same = set(mine) - varying - {"seconds"}
    assert {k: mine[k] for k in same} == {k: doc[k] for k in same}


@pytest.fixture(scope="module")
def exported(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("typed") / "spec"
    return dest, _json("export", f"{tiny_store}#dtype=bf16", "specforge", str(dest), "--limit", "2")


def test_export_returns_its_record_and_prints_its_keys(tiny_store: Path, exported: tuple[Path, dict]):
    from hsstore.interop.exporter import ExportRequest, export_cache

    dest, doc = exported
    again = export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "specforge", str(dest), limit=2))  # its own folder
    _same(doc, again, ExportReport, "export")
    assert again.samples == doc["samples"] == 2 and again.tool_capture in ("output", "input", "unknown")


def test_import_returns_its_record_and_prints_its_keys(exported: tuple[Path, dict], tmp_path: Path):
    from hsstore.interop.importer import ImportRequest, import_cache

    dest, _ = exported
    store = tmp_path / "s.zarr"
    doc = _json("import", "specforge", str(dest), "--store", str(store), "--tokenizer", MODEL, "--label", "mine",
                "--quiet")
    again = import_cache(ImportRequest("specforge", str(dest), str(store), tokenizer=MODEL))  # all present now
    _same(doc, again, ImportReport, "import", optional={"label", "audit"},
          varying={"run", "samples_written", "samples_present", "tokens_written"})
    assert doc["label"] == "mine" and doc["provenance"] == again.provenance == "restored"
    assert again.samples_present == doc["samples_written"] == 2 and again.stated.stated_by == "hsstore-export"


def test_vocab_map_returns_its_record_and_prints_its_keys(tiny_store: Path, tmp_path: Path):
    from hsstore.interop.vocab import write_vocab_map

    doc = _json("vocab-map", f"{tiny_store}#dtype=bf16", "--size", "8", "--out", str(tmp_path / "a"))
    rec = write_vocab_map(f"{tiny_store}#dtype=bf16", 8, str(tmp_path / "b"))
    _same(doc, rec, VocabMapReport, "vocab-map", optional={"out"})
    assert doc["out"] == str(tmp_path / "a") and rec.files == doc["files"]
    on_disk = json.loads((tmp_path / "b" / "vocab-map-8.json").read_text())  # the file: the record less "out"
    assert on_disk == rec.to_dict() and "out" not in on_disk


@pytest.mark.process  # the probe runs in a fresh process (forcing a backend patches what it imports)
def test_env_returns_its_record_and_prints_its_keys():
    from hsstore.capture.model.environment import probe

    doc = _json("env", "--model", MODEL)
    rec = probe(MODEL, None, "cpu")
    _same(doc, rec, EnvReport, "env", optional={"model", "kernels_bound"})
    assert rec.model == doc["model"] == MODEL and isinstance(rec.kernels_bound, dict)


def test_label_prints_its_keys(exported: tuple[Path, dict], tmp_path: Path):
    from hsstore.interop.importer import ImportRequest, import_cache

    store = tmp_path / "s.zarr"
    vid = import_cache(ImportRequest("specforge", str(exported[0]), str(store), tokenizer=MODEL)).variant
    doc = _json("label", f"{store}#{vid}", "first")
    assert set(doc) == _documented("label") and doc == {"store": str(store), "variant": vid, "label": "first",
                                                         "previous": None}
    assert _json("label", f"{store}#first", "second")["previous"] == "first"


def test_check_live_model_returns_the_fingerprint_it_checked(tiny_store: Path):
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.compare.check import check_live_model

    model = ModelSpec(MODEL).load(torch.bfloat16, "cpu", "sdpa")
    fp = check_live_model(model, f"{tiny_store}#dtype=bf16")
    assert isinstance(fp, LiveFingerprint)
    assert fp.environment.dtype == "bf16" and fp.environment.kernels.attention == "sdpa"
    assert set(fp.to_dict()) == {"recipe", "environment"} == _documented("check_live_model(model, \"STORE#SEL\")")

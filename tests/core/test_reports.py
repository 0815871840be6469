"""import, export, vocab-map, env, label and check_live_model return typed records (not dicts), and their
``--json`` is the record's dict: the keys docs/json.md documents for the command, each value as the record
holds it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import get_args

import pytest
import torch
from helpers import REPO, run_cli

from hsstore.core.errors import CorruptData
from hsstore.core.schema.record import Record
from hsstore.core.schema.reports import (
    CheckReport,
    DiffReport,
    EnvReport,
    ExportReport,
    Finding,
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


def _same(
    doc: dict,
    record: Record,
    cls: type[Record],
    command: str,
    optional: set[str] = frozenset(),
    varying: set[str] = frozenset(),
) -> None:
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
    doc = _json(
        "import", "specforge", str(dest), "--store", str(store), "--tokenizer", MODEL, "--label", "mine", "--quiet"
    )
    again = import_cache(ImportRequest("specforge", str(dest), str(store), tokenizer=MODEL))  # all present now
    _same(
        doc,
        again,
        ImportReport,
        "import",
        optional={"label", "audit"},
        varying={"run", "samples_written", "samples_present", "tokens_written"},
    )
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
def test_env_returns_its_record_and_prints_its_keys(monkeypatch: pytest.MonkeyPatch):
    from hsstore.capture.model import environment

    returned = []  # the record the real probe returned to the command (one probe process, not two)
    real = environment.probe
    monkeypatch.setattr(environment, "probe", lambda *a: returned.append(real(*a)) or returned[-1])
    doc = _json("env", "--model", MODEL)
    [rec] = returned
    _same(doc, rec, EnvReport, "env", optional={"model", "kernels_bound"})
    assert rec.model == doc["model"] == MODEL and isinstance(rec.kernels_bound, dict)


def test_label_prints_its_keys(exported: tuple[Path, dict], tmp_path: Path):
    from hsstore.interop.importer import ImportRequest, import_cache

    store = tmp_path / "s.zarr"
    vid = import_cache(ImportRequest("specforge", str(exported[0]), str(store), tokenizer=MODEL)).variant
    doc = _json("label", f"{store}#{vid}", "first")
    assert set(doc) == _documented("label") and doc == {
        "store": str(store),
        "variant": vid,
        "label": "first",
        "previous": None,
    }
    assert _json("label", f"{store}#first", "second")["previous"] == "first"


def test_check_live_model_returns_the_fingerprint_it_checked(tiny_store: Path):
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.compare.check import check_live_model

    model = ModelSpec(MODEL).load(torch.bfloat16, "cpu", "sdpa")
    fp = check_live_model(model, f"{tiny_store}#dtype=bf16")
    assert isinstance(fp, LiveFingerprint)
    assert fp.environment.dtype == "bf16" and fp.environment.kernels.attention == "sdpa"
    assert set(fp.to_dict()) == {"recipe", "environment"} == _documented('check_live_model(model, "STORE#SEL")')


# --- verdict kinds and defect classes are closed sets: a report holding another value is refused

COMPARE = REPO / "hsstore" / "compare"


def _strings(node: ast.AST) -> set[str]:
    """The string constants an expression can evaluate to (a constant, or either branch of a conditional)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def _pairs(target: ast.AST, value: ast.AST):
    """(name, value) of an assignment, element by element where both sides are tuples."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _pairs(t, v)
    elif isinstance(target, ast.Name):
        yield target.id, value


def _verdict_kinds(module: str) -> set[str]:
    """The verdict kinds ``module`` (of hsstore.compare) produces, read from its code: the constants it assigns to
    ``kind``, passes as ``verdict_kind=``, or returns where its return annotation names a ``...VerdictKind``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((COMPARE / module).read_text())):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {s for t in targets for name, v in _pairs(t, node.value) if name == "kind" for s in _strings(v)}
        elif isinstance(node, ast.keyword) and node.arg == "verdict_kind":
            found |= _strings(node.value)
        elif (
            isinstance(node, ast.FunctionDef)
            and isinstance(node.returns, ast.Subscript)
            and "VerdictKind" in ast.unparse(node.returns)
        ):
            at = [i for i, e in enumerate(node.returns.slice.elts) if "VerdictKind" in ast.unparse(e)][0]
            found |= {
                s
                for r in ast.walk(node)
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)
                for s in _strings(r.value.elts[at])
            }
    return found


def test_the_verdict_kinds_are_exactly_those_the_code_produces():
    """check's kinds come from the audit and check.py; diff's from diff.py and sampling.py (its floor verdict)."""
    from hsstore.core.schema.reports import CheckVerdictKind, DiffVerdictKind

    assert _verdict_kinds("audit.py") | _verdict_kinds("check.py") == set(get_args(CheckVerdictKind))
    assert _verdict_kinds("diff.py") | _verdict_kinds("sampling.py") == set(get_args(DiffVerdictKind))


def test_every_defect_the_classifier_names_is_a_defect_kind():
    from hsstore.compare.defects import DEFECTS
    from hsstore.core.schema.reports import DefectKind

    named = set()
    for node in ast.walk(ast.parse((COMPARE / "defects.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("found", "Finding"):
            first = node.args[:1] + [k.value for k in node.keywords if k.arg == "kind"]
            named |= {s for a in first for s in _strings(a)}
    assert named and named <= set(DEFECTS) == set(get_args(DefectKind))


@pytest.mark.parametrize(
    "cls,field,value",
    [
        (CheckReport, "verdict_kind", "no_floor"),
        (CheckReport, "verdict_kind", "inconclusive"),
        (DiffReport, "verdict_kind", "differs"),
        (Finding, "kind", "bit_exact"),
    ],
)
def test_a_report_with_an_unknown_kind_is_refused(cls: type[Record], field: str, value: str):
    doc = _REPORTS[cls]
    cls.from_json(json.dumps(doc).encode(), "a report")  # as the code writes it: accepted
    with pytest.raises(CorruptData, match=rf"{field}.*{value}"):
        cls.from_json(json.dumps({**doc, field: value}).encode(), "a report")


_LAYER = {
    "layer": 1,
    "tokens": 4,
    "mean_abs": 0.0,
    "max_abs": 0.0,
    "rel_l2": 0.0,
    "cos_mean": 1.0,
    "cos_min": 1.0,
    "cos_p01": 1.0,
    "bit_exact": 1.0,
}
_REPORTS: dict[type[Record], dict] = {
    CheckReport: {
        "model": MODEL,
        "target": "s.zarr#dtype=bf16",
        "variant": "s.zarr#v1",
        "device": "cpu",
        "dtype": "bf16",
        "model_fingerprint": "f",
        "recorded_model_fingerprint": "f",
        "same_model": True,
        "samples": 1,
        "tokens": 4,
        "keys": ["k"],
        "batches": 1,
        "batching": "alone",
        "layers": [_LAYER],
        "environment_differences": [],
        "verdict": "identical",
        "verdict_kind": "identical",
    },
    DiffReport: {
        "a": "a#1",
        "b": "b#2",
        "shared_samples": 1,
        "only_a": 0,
        "only_b": 0,
        "tokens": 4,
        "loss_only": False,
        "layers": [_LAYER],
        "worst_samples": [],
        "verdict": "identical",
        "verdict_kind": "identical",
    },
    Finding: {"kind": "nan", "key": "k", "layer": 1, "detail": "layer 1: NaN rows"},
}

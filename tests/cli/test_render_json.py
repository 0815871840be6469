"""`--json` of info, verify, gc, convert and diff stays what scripts read: pinned to the documents main printed
(tests/data/json/, made from the format-v1 fixture store before the results became typed records), key order
included; fields are only ever added (ADDED, documented in docs/json.md).

Regenerate the pinned documents (only for a deliberate, documented change): HSSTORE_PIN_JSON=1 pytest this file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, run_cli

from hsstore.storage import layout
from hsstore.storage.store import Store
from hsstore.testing.factories import crashed_unit

PINNED = REPO / "tests" / "data" / "json"
FIXTURE = REPO / "tests" / "data" / "format-v1.zarr"
BF16, FP32 = "b4b21ec5d215", "3cd16953cadd"  # the fixture's variants
# fields added since the documents were pinned: (document, path with "*" for any list item or key)
ADDED = {
    ("info", ("variants", "*", "distinguished_by")),
    ("info", ("variants", "*", "audits", "*", "restatement")),
    ("info", ("models",)),
    ("info", ("variants", "*", "label")),
    ("info", ("variants", "*", "selector")),
    ("info", ("variants", "*", "model")),
    ("info", ("generations",)),  # labels, selectors and models: issue 43
    *((doc, (field,)) for doc in ("verify_clean", "verify_damaged") for field in ("damaged_units", "quarantined")),
}
AUDIT = {
    "kind": "audit",
    "audited_at": "2026-12-01T00:00:00+00:00",
    "model": "builtin:tiny-llama",
    "model_fingerprint": "0123456789abcdef0123",
    "samples": 3,
    "population": 3,
    "verdict": "every checked sample is bit-exact",
    "verdict_kind": "identical",
    "defects": {},
    "defective_samples": 0,
    "defect_rate_upper": 0.63,
    "bound": "fewer than 63 % of samples are defective (95 %)",
    "recompute": {"backend": "torch", "dtype": "bf16"},
    "assumed": {"attention": "sdpa (the default)"},
}


def _out(*args: str, code: int = 0) -> str:
    r = run_cli(*args)
    assert r.returncode == code, r.stderr
    return r.stdout


def _documents(tmp: Path) -> dict[str, str]:
    """Every pinned command's stdout on copies of the fixture store (name -> text, paths as <TMP>)."""
    s = tmp / "s.zarr"
    shutil.copytree(FIXTURE, s)
    Store.open(s, mode="a").io.put_atomic(
        layout.build_key(BF16, "audit-20261201T000000Z-00000000"), json.dumps(AUDIT, sort_keys=True).encode()
    )
    out = {"convert": _out("convert", f"{s}#dtype=bf16", "--precision", "fp8-e4m3", "--workers", "1", "--json")}
    fp8 = json.loads(out["convert"])["variant"]
    out["info"] = _out("info", str(s), "--json")
    out["verify_clean"] = _out("verify", str(s), "--json")
    out["diff"] = _out(
        "diff", f"{s}#dtype=bf16", f"{s}#precision=fp8-e4m3", "--floor", f"{s}#dtype=fp32", "--json", "-"
    )
    store = Store.open(s, mode="a")
    crashed_unit(store, BF16, [4, 6], seed=7, writer_id="crashed")
    foreign = crashed_unit(store, BF16, [3], seed=8, writer_id="foreign")
    store.io.put(layout.unit_prefix(BF16, foreign) + "/notes.txt", [b"not hsstore's"])
    store.io.put("variants/.DS_Store", [b""])
    chunk = s / "variants" / FP32 / "units" / "fixture-000000" / "layer_0" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    out["verify_damaged"] = _out("verify", str(s), "--json", code=1)
    out["gc_dry_run"] = _out("gc", str(s), "--json", "--force", "--dry-run")
    out["gc"] = _out("gc", str(s), "--json", "--force")
    return {k: v.replace(str(tmp), "<TMP>").replace(fp8, "<FP8>") for k, v in out.items()}


def _pairs(text: str) -> Any:
    """The JSON document with every object as a list of (key, value) pairs: its key order kept. Timings are
    zeroed, and so are the sizes of what this run's convert wrote: its unit records name the writer's pid and
    start time, whose digits vary from run to run."""

    def hook(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        keys = dict(pairs)
        written = keys.get("id") == "<FP8>" or "samples_converted" in keys
        return [
            (k, 0.0 if k == "seconds" or (written and k in ("bytes", "compression_ratio")) else v) for k, v in pairs
        ]

    return json.loads(text, object_pairs_hook=hook)


def _without(doc: Any, path: tuple[str, ...]) -> Any:
    """``doc`` without the field at ``path`` ("*": every list item or key), which must be there."""
    if not path:
        return doc
    head, rest = path[0], path[1:]
    if isinstance(doc, list) and doc and isinstance(doc[0], tuple):  # an object
        if not rest:
            assert head in [k for k, _ in doc], f"added field {head!r} is missing"
            return [(k, v) for k, v in doc if k != head]
        return [(k, _without(v, rest) if head in ("*", k) else v) for k, v in doc]
    assert head == "*" and isinstance(doc, list), path
    return [_without(v, rest) for v in doc]


def _same(a: Any, b: Any, where: str = "$") -> None:
    """Equal documents, key order included (floats to 1e-9: the arithmetic is the same, the machine may not be)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300) or (math.isnan(a) and math.isnan(b)), (
            f"{where}: {a} != {b}"
        )
        return
    assert type(a) is type(b), f"{where}: {a!r} != {b!r}"
    if isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        if a and isinstance(a[0], tuple):
            assert [k for k, _ in a] == [k for k, _ in b], f"{where}: keys {[k for k, _ in a]} != {[k for k, _ in b]}"
            for (k, x), (_, y) in zip(a, b):
                _same(x, y, f"{where}.{k}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
        return
    assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    docs = _documents(tmp_path_factory.mktemp("json"))
    if os.environ.get("HSSTORE_PIN_JSON"):
        PINNED.mkdir(exist_ok=True)
        for name, text in docs.items():
            (PINNED / f"{name}.json").write_text(text)
    return docs


@pytest.mark.parametrize("name", ["info", "verify_clean", "verify_damaged", "gc_dry_run", "gc", "convert", "diff"])
def test_json_output_is_the_pinned_document(documents: dict[str, str], name: str):
    now = _pairs(documents[name])
    for doc, path in ADDED:
        if doc == name:
            now = _without(now, path)
    _same(now, _pairs((PINNED / f"{name}.json").read_text()))


def test_the_pinned_documents_cover_what_the_commands_can_say(documents: dict[str, str]):
    """The fixture exercises every part of each document (a pinned empty list proves little)."""
    info, bad = json.loads(documents["info"]), json.loads(documents["verify_damaged"])
    fp8 = next(v for v in info["variants"] if v["precision"])
    assert fp8["storage"]["floor"] and fp8["storage"]["error_vs_floor"] and fp8["storage"]["source"]
    assert any(v["audits"] for v in info["variants"])
    assert {p["variant"] for p in bad["problems"]} >= {FP32, None} and bad["notes"]
    assert any(p["unit"] for p in bad["problems"])
    for name in ("gc_dry_run", "gc"):
        gc = json.loads(documents[name])
        assert gc["removed_units"] and gc["skipped"] and gc["dry_run"] == (name == "gc_dry_run")
    assert json.loads(documents["diff"])["floor_layers"]


def _renderers() -> dict[str, tuple[type, Any]]:
    from hsstore.cli.render import diff_text, gc_text, info_text, verify_text
    from hsstore.cli.store_cmd import convert_text
    from hsstore.core.schema.reports import ConvertReport, DiffReport, GcReport, StoreInfo, VerifyReport

    return {
        "info": (StoreInfo, info_text),
        "verify_clean": (VerifyReport, verify_text),
        "verify_damaged": (VerifyReport, verify_text),
        "gc_dry_run": (GcReport, gc_text),
        "gc": (GcReport, gc_text),
        "convert": (ConvertReport, convert_text),
        "diff": (DiffReport, diff_text),
    }


@pytest.mark.parametrize("name", ["info", "verify_clean", "verify_damaged", "gc_dry_run", "gc", "convert", "diff"])
def test_the_text_is_rendered_from_the_record(name: str):
    """Each pinned document decodes strictly as its record (the record is the documented schema), and the
    command's text rendered from it is the text main printed for that document."""
    record, render = _renderers()[name]
    doc = json.loads((PINNED / f"{name}.json").read_text())
    text = render(record.from_dict(doc, f"pinned {name}.json"))
    if os.environ.get("HSSTORE_PIN_JSON"):
        (PINNED / f"{name}.txt").write_text(text + "\n")
    assert text + "\n" == (PINNED / f"{name}.txt").read_text()


def test_info_shows_the_audit_records_it_can_read_and_leaves_out_the_rest(tmp_path: Path):
    """An audit record is read as a typed record: one a later hsstore wrote with more fields is shown (without
    them); a damaged one (not JSON, a wrong type, no time) is left out, not a traceback in ``info``."""
    s = tmp_path / "s.zarr"
    shutil.copytree(FIXTURE, s)
    io = Store.open(s, mode="a").io
    for i, rec in enumerate(
        [
            AUDIT,
            {**AUDIT, "added_later": 1},
            {**AUDIT, "samples": "3"},
            {k: v for k, v in AUDIT.items() if k != "audited_at"},
            "not json",
        ]
    ):
        raw = rec.encode() if isinstance(rec, str) else json.dumps(rec).encode()
        io.put_atomic(layout.build_key(BF16, f"audit-20261201T00000{i}Z-0000000{i}"), raw)
    r = run_cli("info", str(s), "--json")
    assert r.returncode == 0, r.stderr
    (bf16,) = [v for v in json.loads(r.stdout)["variants"] if v["id"] == BF16]
    assert bf16["audits"] == [{**AUDIT, "restatement": None}] * 2  # a record from before restatements reads as none
    text = run_cli("info", str(s))
    assert text.returncode == 0 and text.stdout.count("audited 2026-12-01T00:00:00+00:00") == 2

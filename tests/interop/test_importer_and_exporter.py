"""Import and export of SpecForge, Model-Optimizer, speculators and EAGLE caches: files written the way
each tool writes them, content keys, provenance statements, bit-exact round trips, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_bit_exact, main_exit, run_cli, save_local_model
from interop_files import TOKENIZER, WRITERS, random_samples

from hsstore import Store
from hsstore.capture.model.spec import ModelSpec
from hsstore.core.errors import BadInput
from hsstore.core.keys import sample_key
from hsstore.core.schema.provenance import Provenance
from hsstore.core.schema.reports import ExportReport, ImportReport
from hsstore.interop import exporter, importer
from hsstore.interop.exporter import ExportRequest
from hsstore.interop.formats import get_format
from hsstore.interop.imported_provenance import tokenizer_identity
from hsstore.interop.importer import ImportRequest
from hsstore.storage.verify import verify


# these tests read the reports by key: the records' to_dict(), the documents `--json` prints (docs/json.md);
# tests/core/test_reports.py checks the records themselves
def export_cache(req: ExportRequest) -> dict:
    r = exporter.export_cache(req)
    assert isinstance(r, ExportReport)
    return r.to_dict()


def import_cache(req: ImportRequest) -> dict:
    r = importer.import_cache(req)
    assert isinstance(r, ImportReport)
    return r.to_dict()


STATED = {
    "specforge": "0,1,2,final_norm",
    "modelopt": "0,1,2,final_norm",
    "speculators": "1,2,3,4",
    "eagle": "final_norm",
}
CAPTURE = {"specforge": "output", "modelopt": "output", "speculators": "input", "eagle": "output"}
TOOL = {"specforge": "SpecForge", "modelopt": "Model-Optimizer", "speculators": "speculators", "eagle": "EAGLE"}
HSSTORE = {
    "specforge": ([0, 1, 2], [4]),
    "modelopt": ([0, 1, 2], [4]),
    "speculators": ([0, 1, 2], [3]),
    "eagle": ([], [4]),
}


def _import(fmt: str, src: Path, store: Path, **kw) -> dict:
    args = {"tokenizer": TOKENIZER, "num_layers": 4, "layers": STATED[fmt], "capture": CAPTURE[fmt], **kw}
    return import_cache(ImportRequest(fmt, str(src), str(store), **args))


def _reader(store: Path, sel: str | None = None):
    s = Store.open(store)
    return s.reader(s.select(sel))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_import_keys_states_and_provenance(fmt: str, tmp_path: Path):
    samples = random_samples(n_aux=0 if fmt == "eagle" else 3)
    WRITERS[fmt](tmp_path / "src", samples)
    report = _import(fmt, tmp_path / "src", tmp_path / "s.zarr")
    assert report["samples_written"] == len(samples) and report["samples_present"] == 0
    r = _reader(tmp_path / "s.zarr")
    aux_ids, target_ids = HSSTORE[fmt]
    assert r.record.layers == {"aux": aux_ids, "target": target_ids}
    fp = tokenizer_identity(TOKENIZER)[0]["fingerprint"]
    for s in samples:
        key = sample_key(fp, s.ids.numpy(), s.mask.numpy())  # hsstore's content key of the same tokens
        got = r.read(key)
        assert torch.equal(got["input_ids"], s.ids) and torch.equal(got["loss_mask"].long(), s.mask)
        for j, layer in enumerate(aux_ids):
            assert torch.equal(_bits(got["layers"][layer]), _bits(s.aux[:, j]))
        assert torch.equal(_bits(got["layers"][target_ids[0]]), _bits(s.target))
    prov = r.record.provenance
    assert prov["source"]["tool"] == TOOL[fmt] and prov["source"]["format"] == fmt
    assert prov["source"]["layers"] == [int(x) if x.isdigit() else x for x in STATED[fmt].split(",")]
    assert prov["source"]["capture"] == CAPTURE[fmt] and prov["source"]["stated_by"] == "user"
    assert prov["recipe"]["capture"] == "decoder_layer_output"
    assert prov["recipe"]["final_norm"] is (fmt != "speculators")
    assert Provenance.from_dict(prov, "imported").to_dict() == prov  # the typed schema readers decode with
    env = prov["environment"]
    assert env["dtype"] == "bf16" and env["device"] == env["backend"] == "unknown"
    assert set(env["kernels"].values()) == {"unknown"} and prov["recipe"]["model"]["fingerprint"] == "unknown"
    done = [json.loads(p.read_text()) for p in (tmp_path / "s.zarr").rglob("builds/import-*.json")]
    files = {f[0]: f[3] for d in done if d["kind"] == "import-chunk" for e in d["entries"] for f in e["files"]}
    assert len(files) == len(samples)  # every source file's xxh3 is recorded
    assert verify(Store.open(tmp_path / "s.zarr")).ok


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_export_then_import_is_bit_exact_and_needs_no_statement(fmt: str, tmp_path: Path):
    samples = random_samples(n_aux=0 if fmt == "eagle" else 3, dtype=torch.float16)
    WRITERS[fmt](tmp_path / "src", samples)
    _import(fmt, tmp_path / "src", tmp_path / "a.zarr")
    out = export_cache(ExportRequest(str(tmp_path / "a.zarr"), fmt, str(tmp_path / "out")))
    assert out["samples"] == len(samples) and out["tool_capture"] == CAPTURE[fmt]
    assert out["tool_layers"] == [int(x) if x.isdigit() else x for x in STATED[fmt].split(",")]
    back = import_cache(ImportRequest(fmt, str(tmp_path / "out"), str(tmp_path / "b.zarr"), tokenizer=TOKENIZER))
    assert back["stated"]["stated_by"] == "hsstore-export"
    a, b = _reader(tmp_path / "a.zarr"), _reader(tmp_path / "b.zarr")
    assert a.record.layers == b.record.layers and sorted(a.keys) == sorted(b.keys)
    for key in a.keys:
        x, y = a.read(key), b.read(key)
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for layer in a.record.all_layers:
            assert x["layers"][layer].dtype == torch.float16
            assert torch.equal(_bits(x["layers"][layer]), _bits(y["layers"][layer]))


def test_specforge_gzip_files_import(tmp_path: Path):
    samples = random_samples(n=3)
    WRITERS["specforge"](tmp_path / "src", samples, compress=True)
    assert _import("specforge", tmp_path / "src", tmp_path / "s.zarr")["samples_written"] == 3
    out = export_cache(ExportRequest(str(tmp_path / "s.zarr"), "specforge", str(tmp_path / "gz"), compress=True))
    assert out["samples"] == 3 and len(list((tmp_path / "gz").rglob("*.ckpt.gz"))) == 3


def test_resume_skips_unchanged_files_without_reading_them(tmp_path: Path):
    samples = random_samples(n=6)
    WRITERS["specforge"](tmp_path / "src", samples)
    first = _import("specforge", tmp_path / "src", tmp_path / "s.zarr", limit=4)  # as if killed after 4 files
    assert first["samples_written"] == 4
    # corrupt an imported file but keep its size and mtime: a resumed import must not read it again
    # (data_0 is not touched: every import reads the first file for the cache's geometry)
    f = tmp_path / "src" / "rows_0-2000" / "data_2.ckpt"
    st = f.stat()
    f.write_bytes(b"\0" * st.st_size)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = _import("specforge", tmp_path / "src", tmp_path / "s.zarr")
    assert second["samples_written"] == 2 and second["samples_present"] == 4 and second["samples"] == 6
    assert len(_reader(tmp_path / "s.zarr").keys) == 6
    # a file that changed (new mtime) is read again: the damaged one is now refused by name
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(BadInput, match="data_2.ckpt: not a plain torch.save file"):
        _import("specforge", tmp_path / "src", tmp_path / "s.zarr")


def test_duplicates_and_skip_bad_are_counted(tmp_path: Path):
    samples = random_samples(n=4)
    WRITERS["eagle"](tmp_path / "src", samples + samples[:2])
    (tmp_path / "src" / "0" / "data_9.ckpt").write_bytes(b"not a torch file")
    r = _import("eagle", tmp_path / "src", tmp_path / "s.zarr", skip_bad=True)
    assert (r["samples_written"], r["duplicates"], r["skipped_bad"]) == (4, 2, 1)
    assert "data_9.ckpt" in r["bad"][0]["item"]


def test_speculators_rows_without_states_are_counted_not_imported(tmp_path: Path):
    samples = random_samples(n=5)
    WRITERS["speculators"](tmp_path / "src", samples, skip_rows=(1, 3))
    r = _import("speculators", tmp_path / "src", tmp_path / "s.zarr")
    assert r["samples_written"] == 3 and r["missing_states"] == 2


def test_unknown_capture_keeps_ids_and_says_unknown(tmp_path: Path):
    WRITERS["speculators"](tmp_path / "src", random_samples(n=2))
    r = _import("speculators", tmp_path / "src", tmp_path / "s.zarr", capture="unknown")
    prov = _reader(tmp_path / "s.zarr").record.provenance
    assert r["layers"] == {"aux": [1, 2, 3], "target": [4]}  # as written: diff --align finds what they are
    assert prov["recipe"]["capture"] == "unknown" and "final_norm" not in prov["recipe"]  # absent = unknown


def test_vllm_convention_lines_up_with_a_native_build(tiny_store: Path, tmp_path: Path):
    """A cache in vLLM's numbering (state entering layer i), imported with --capture input, holds the
    very samples and states of the native build: same keys, bit-exact, so diff joins them."""
    native = _reader(tiny_store, "dtype=bf16")
    n_layers = native.record.provenance["recipe"]["model"]["num_layers"]
    out = export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "speculators", str(tmp_path / "vllm")))
    assert out["tool_layers"] == [1, 2, 4] and n_layers == 4  # outputs of 0, 1, 3 = states entering 1, 2, 4
    (tmp_path / "vllm" / "hsstore-export.json").unlink()  # a foreign cache: the user states the convention
    r = import_cache(
        ImportRequest(
            "speculators",
            str(tmp_path / "vllm"),
            str(tmp_path / "s.zarr"),
            tokenizer="builtin:tiny-qwen3_5",
            model="builtin:tiny-qwen3_5",
            layers="1,2,4",
            capture="input",
        )
    )
    assert r["layers"] == native.record.layers
    imported = _reader(tmp_path / "s.zarr")
    assert imported.record.provenance["recipe"]["model"] == native.record.provenance["recipe"]["model"]
    assert sorted(imported.keys) == sorted(native.keys)
    assert_bit_exact(str(tmp_path / "s.zarr"), f"{tiny_store}#dtype=bf16", len(native.keys))


def test_cli_import_export_vocab_map_round_trip(tmp_path: Path, capsys):
    WRITERS["modelopt"](tmp_path / "src", random_samples(n=3), prenorm=False)
    r = run_cli(
        "import",
        "modelopt",
        str(tmp_path / "src"),
        "--store",
        str(tmp_path / "s.zarr"),
        "--tokenizer",
        TOKENIZER,
        "--num-layers",
        "4",
        "--layers",
        "0,1,2,final_norm",
        "--capture",
        "output",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["samples_written"] == 3 and rep["stated"]["claims"] == {"prenorm": False}
    assert main_exit(["export", str(tmp_path / "s.zarr"), "modelopt", str(tmp_path / "out")]) == 0
    assert "slots: aux=[0, 1, 2] target=[4]" in capsys.readouterr().out
    pt = torch.load(next((tmp_path / "out").glob("*.pt")), weights_only=True)
    assert pt["hidden_states_prenorm"] is False and set(pt) >= {"input_ids", "hidden_states", "aux_hidden_states"}
    assert main_exit(["vocab-map", str(tmp_path / "s.zarr"), "--size", "16", "--out", str(tmp_path / "vm")]) == 0
    d2t, t2d = np.load(tmp_path / "vm" / "d2t-16.npy"), np.load(tmp_path / "vm" / "t2d-16.npy")
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_ and t2d.sum() == 16
    assert np.array_equal(np.arange(16) + d2t, np.flatnonzero(t2d))


def test_an_imported_cache_records_no_pinned_chat_date(tmp_path: Path):
    """Its tokens were rendered by another tool, on a day hsstore does not know: the tokenizer's identity says
    no chat_date even when its template prints one (a native build of it records 2024-07-26)."""
    folder = save_local_model(tmp_path / "dated")
    template = folder / "chat_template.jinja"
    template.write_text("{{ strftime_now('%Y-%m-%d') }}" + template.read_text())
    ident, _ = tokenizer_identity(str(folder))
    assert "chat_date" not in ident and ident["has_chat_template"] is True
    spec = ModelSpec(str(folder))
    assert spec.tokenizer_identity(spec.tokenizer()).chat_date == "2024-07-26"  # what a native build records


def test_a_re_export_with_other_options_replaces_the_folder_whole(tmp_path: Path):
    """Re-exporting into an earlier export's folder with another target layer and --limit leaves exactly
    the new export: no file of the earlier one stays to be imported under the new record's layers."""
    WRITERS["specforge"](tmp_path / "src", random_samples(n=6))
    _import("specforge", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), "specforge", str(out)))
    r = export_cache(
        ExportRequest(str(tmp_path / "a.zarr"), "specforge", str(out), aux=[0, 1], target_layer=2, limit=3)
    )
    assert r["samples"] == 3 and len(list(out.rglob("*.ckpt"))) == 3
    back = import_cache(ImportRequest("specforge", str(out), str(tmp_path / "b.zarr"), tokenizer=TOKENIZER))
    assert back["samples"] == 3
    a, b = _reader(tmp_path / "a.zarr"), _reader(tmp_path / "b.zarr")
    assert b.record.layers == {"aux": [0, 1], "target": [2]}
    for key in b.keys:
        assert torch.equal(_bits(a.read(key)["layers"][2]), _bits(b.read(key)["layers"][2]))


@pytest.mark.parametrize("fmt", ["speculators", "modelopt"])
def test_a_re_export_removes_only_files_an_export_writes(tmp_path: Path, fmt: str):
    """Files a user put into an earlier export's folder (a config.json, notes in a tool's suffix) stay when
    the folder is re-exported: only names the layout's own writer gives are an earlier export's."""
    WRITERS["modelopt"](tmp_path / "src", random_samples(n=4))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), fmt, str(out)))
    theirs = {"config.json": b"{}", "notes/run.safetensors": b"x", "my-draft.pt": b"y", "README.json": b"[]"}
    for rel, data in theirs.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    r = export_cache(ExportRequest(str(tmp_path / "a.zarr"), fmt, str(out), limit=2))
    assert r["samples"] == 2
    assert {rel: (out / rel).read_bytes() for rel in theirs} == theirs
    sample_files = [
        p for p in out.rglob("*") if p.is_file() and get_format(fmt).exported.fullmatch(p.relative_to(out).as_posix())
    ]
    assert (
        len([p for p in sample_files if p.suffix in (".pt", ".safetensors")]) == 2
    )  # the earlier export's other two went


@pytest.mark.parametrize("fmt", ["eagle", "specforge"])
def test_a_folder_replaced_since_its_export_is_not_taken_for_it(tmp_path: Path, fmt: str):
    """The export's folder was removed and another tool's cache written there (EAGLE's record lies beside the
    folder and outlives it; a copied-in record does the same): a re-export is refused, and every file of the
    other cache stays. Before, the record was trusted, and the re-export overwrote some of them and removed
    the rest as an earlier export's."""
    import shutil

    WRITERS["modelopt"](tmp_path / "src", random_samples(n=4))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), fmt, str(out)))
    record = get_format(fmt).sidecar(out)
    kept = record.read_bytes()
    shutil.rmtree(out)
    WRITERS[fmt](out, random_samples(n=6, seed=1))  # the tool's own cache, in the layout's own file names
    record.write_bytes(kept)
    theirs = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p != record}
    with pytest.raises(BadInput, match=f"is not the export .* describes: it holds 6 file.s. named as {fmt} files"):
        export_cache(ExportRequest(str(tmp_path / "a.zarr"), fmt, str(out), limit=2))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p != record} == theirs


def test_a_stopped_exports_record_is_not_taken_for_a_folder_made_anew(tmp_path: Path):
    """An EAGLE export stopped midway (its record says ``complete: false``), its folder removed and another
    tool's cache written in its place: a re-export is refused and the cache stays; the stopped export's own
    folder still resumes. Before, the record was trusted and the other cache overwritten and removed."""
    import shutil

    from hsstore.interop.importer import folder_mark

    if folder_mark(tmp_path) is None:  # the mark is an extended attribute: where there are none, no mark is kept
        pytest.skip(f"{tmp_path} keeps no extended attributes (the mark, and this check, need them)")

    WRITERS["modelopt"](tmp_path / "src", random_samples(n=4))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out, fmt = tmp_path / "out", get_format("eagle")
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), "eagle", str(out)))
    stopped = {k: v for k, v in json.loads(fmt.sidecar(out).read_text()).items() if not k.startswith("folder_f")}
    fmt.sidecar(out).write_text(json.dumps({**stopped, "complete": False}))  # what a stopped export leaves
    assert export_cache(ExportRequest(str(tmp_path / "a.zarr"), "eagle", str(out), limit=3))["samples"] == 3
    fmt.sidecar(out).write_text(json.dumps({**stopped, "complete": False}))
    shutil.rmtree(out)
    WRITERS["eagle"](out, random_samples(n=6, seed=1))
    theirs = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(BadInput, match="is not the folder the stopped export .* was writing: it was made anew"):
        export_cache(ExportRequest(str(tmp_path / "a.zarr"), "eagle", str(out), limit=2))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == theirs


@pytest.mark.parametrize("spelled", [".", "./"])
def test_an_eagle_export_into_the_current_folder_keeps_its_record_outside_it(tmp_path: Path, monkeypatch, spelled: str):
    """``hsstore export S eagle .``: the record goes beside the folder, as for any
    other name. Before, it was written inside it as ``.hsstore-export.json``, and EAGLE's loader, which loads
    every file of the folder, would load the record as a sample."""
    WRITERS["modelopt"](tmp_path / "src", random_samples(n=3))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    r = export_cache(ExportRequest(str(tmp_path / "a.zarr"), "eagle", spelled))
    files = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()]
    assert len(files) == 3 and all(get_format("eagle").exported.fullmatch(f) for f in files), files
    assert r["samples"] == 3 and (tmp_path / "out.hsstore-export.json").is_file()
    assert import_cache(ImportRequest("eagle", spelled, str(tmp_path / "b.zarr"), tokenizer=TOKENIZER))["samples"] == 3


def test_an_export_that_never_finished_is_refused_by_import(tmp_path: Path):
    """A killed export leaves its record saying ``complete: false``: import refuses the folder in one line
    naming the fix, rather than importing a part of a variant as if whole."""
    WRITERS["modelopt"](tmp_path / "src", random_samples(n=3))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), "modelopt", str(out)))
    record = json.loads((out / "hsstore-export.json").read_text())
    (out / "hsstore-export.json").write_text(json.dumps({**record, "complete": False}))  # as a SIGKILL leaves it
    next(out.rglob("*.pt")).unlink()
    r = run_cli("import", "modelopt", str(out), "--store", str(tmp_path / "b.zarr"), "--tokenizer", TOKENIZER)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "never finished (complete: false" in r.stderr and "Re-run the same `hsstore export`" in r.stderr
    assert not (tmp_path / "b.zarr").exists()


def test_two_exports_into_one_folder_at_once_are_refused(tmp_path: Path):
    """An export holds its folder while it writes; a second export into it meanwhile is refused in one line
    (it would remove the first one's files as stale, or they its), and runs once the first is done."""
    from hsstore.storage.leases import lock_folder_alone

    WRITERS["modelopt"](tmp_path / "src", random_samples(n=2))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    out.mkdir()
    first = lock_folder_alone(str(out))  # what a running export holds
    assert first is not None
    with pytest.raises(BadInput, match=r"being written by another export \(or read by an import\) right now"):
        export_cache(ExportRequest(str(tmp_path / "a.zarr"), "modelopt", str(out)))
    first.release()
    assert export_cache(ExportRequest(str(tmp_path / "a.zarr"), "modelopt", str(out)))["samples"] == 2


def test_an_export_that_finished_while_another_waited_is_not_replaced(tmp_path: Path, monkeypatch):
    """Exports of two variants into one new folder: the second looks at the folder only once it holds it.
    Before, it judged the folder (empty) before taking it, so an export of another variant that finished in
    between was replaced whole — its files removed as stale, the record rewritten."""
    from helpers import new_variant, write_unit

    from hsstore.interop import exporter

    s = Store.create(tmp_path / "two.zarr")
    vids = [new_variant(s, dtype=d) for d in ("bf16", "fp32")]
    for vid in vids:
        write_unit(s, vid, [4, 6])
    out = tmp_path / "out"
    real = exporter.lock_folder_alone

    def first_finishes_meanwhile(path: str):
        monkeypatch.setattr(exporter, "lock_folder_alone", real)
        export_cache(ExportRequest(f"{tmp_path / 'two.zarr'}#{vids[0]}", "modelopt", str(out)))
        return real(path)

    monkeypatch.setattr(exporter, "lock_folder_alone", first_finishes_meanwhile)
    with pytest.raises(BadInput, match=f"holds an export of variant {vids[0]}, not {vids[1]}"):
        export_cache(ExportRequest(f"{tmp_path / 'two.zarr'}#{vids[1]}", "modelopt", str(out)))
    rec = json.loads((out / "hsstore-export.json").read_text())
    assert rec["variant"] == vids[0] and rec["complete"] and rec["n_samples"] == 2
    assert len([p for p in out.rglob("*.pt")]) == 2


def test_an_export_never_rewrites_a_folder_an_import_is_reading(tmp_path: Path):
    """An import holds its folder shared while it reads; a re-export into it meanwhile is refused (it would
    replace files under the import, which labels them with the record it read first), and an import of a
    folder an export is writing is refused before it reads anything."""
    from hsstore.storage.leases import lock_folder_alone, share_folder

    WRITERS["modelopt"](tmp_path / "src", random_samples(n=3))
    _import("modelopt", tmp_path / "src", tmp_path / "a.zarr")
    out = tmp_path / "out"
    export_cache(ExportRequest(str(tmp_path / "a.zarr"), "modelopt", str(out)))
    reading = share_folder(str(out))  # what a running import holds
    assert reading is not None
    try:
        with pytest.raises(BadInput, match="read by an import"):
            export_cache(ExportRequest(str(tmp_path / "a.zarr"), "modelopt", str(out), limit=1))
    finally:
        reading.release()
    writing = lock_folder_alone(str(out))  # what a running export holds
    assert writing is not None
    try:
        with pytest.raises(BadInput, match="is being written by an `hsstore export` right now"):
            import_cache(ImportRequest("modelopt", str(out), str(tmp_path / "b.zarr"), tokenizer=TOKENIZER))
    finally:
        writing.release()
    assert not (tmp_path / "b.zarr").exists()
    assert (
        import_cache(ImportRequest("modelopt", str(out), str(tmp_path / "b.zarr"), tokenizer=TOKENIZER))["samples"] == 3
    )


def test_import_records_stay_small_whatever_the_paths(tmp_path: Path):
    """Hundreds of files under a 2,000-character folder: the import's records are split so none grows past
    RECORD_BYTES (one record of them all would be megabytes, which verify calls damage past the record cap);
    verify stays clean and a re-run trusts the records instead of failing on them."""
    from hsstore.interop.imported_provenance import RECORD_BYTES
    from hsstore.storage import layout

    deep = tmp_path / "src" / "/".join(["d" * 249] * 8)
    s = random_samples(n=1)[0]
    rec = {"input_ids": s.ids, "hidden_state": s.target, "loss_mask": s.mask}
    entry = 2 * len(str(deep.relative_to(tmp_path / "src"))) + 200  # item and file path, key, hash, sizes
    n = RECORD_BYTES // entry + 20  # more entries than one record holds
    deep.mkdir(parents=True)
    for i in range(n):
        torch.save(rec, deep / f"data_{i}.ckpt")
    r = _import("eagle", tmp_path / "src", tmp_path / "s.zarr")
    assert (r["items"], r["samples_written"], r["duplicates"]) == (n, 1, n - 1)
    store = Store.open(tmp_path / "s.zarr")
    records = [k for k in store.io.list(layout.builds_prefix(r["variant"])) if "import-" in k]
    sizes = [len(store.io.get(k)) for k in records]
    assert len(sizes) > 2 and max(sizes) <= RECORD_BYTES + 2 * entry, sizes
    assert verify(store).ok
    again = _import("eagle", tmp_path / "src", tmp_path / "s.zarr")
    assert again["samples_present"] + again["duplicates"] == n and again["samples_written"] == 0


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_an_export_imported_again_keeps_its_provenance(fmt: str, tiny_store: Path, tmp_path: Path):
    """``export`` then ``import`` of the folder restores the exported variant's provenance (backend, device,
    kernels, versions), so ``require=`` the original opens the copy without allow_drift. Before, every field
    the files do not hold was 'unknown' and require= failed in 28 fields though every state was identical."""
    from hsstore.read.dataset import HiddenStateDataset

    original = f"{tiny_store}#dtype=bf16"
    export_cache(ExportRequest(original, fmt, str(tmp_path / "out")))
    r = import_cache(
        ImportRequest(fmt, str(tmp_path / "out"), str(tmp_path / "b.zarr"), tokenizer="builtin:tiny-qwen3_5")
    )
    assert r["provenance"] == "restored" and r["provenance_note"] is None
    native = _reader(tiny_store, "dtype=bf16").record.provenance
    env = _reader(tmp_path / "b.zarr").record.provenance["environment"]
    assert env == native["environment"] and "unknown" not in json.dumps(env)
    drift = ["recipe.layers"] if fmt == "eagle" else []  # an EAGLE file holds the target only: fewer layers
    ds = HiddenStateDataset(str(tmp_path / "b.zarr"), require=original, allow_drift=drift)
    assert len(ds) == len(_reader(tiny_store, "dtype=bf16").keys)
    if fmt != "eagle":
        assert_bit_exact(str(tmp_path / "b.zarr"), original, len(ds))


def _tamper_file(out: Path, fmt: str) -> None:
    """Change one state bit of one exported sample file, keeping the file loadable by its tool."""
    p = sorted(q for q in out.rglob("*") if q.is_file() and q.suffix in (".ckpt", ".pt"))[0]
    obj = torch.load(p, weights_only=True)
    key = "hidden_states" if "hidden_states" in obj else next(k for k, v in obj.items() if v.dtype.is_floating_point)
    t = obj[key].clone()
    t.view(-1)[0] = t.view(-1)[0] + 1
    obj[key] = t
    torch.save(obj, p)


@pytest.mark.parametrize("damage", ["file", "record"])
@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_an_export_record_that_does_not_match_its_files_is_ignored(
    fmt: str, damage: str, tiny_store: Path, tmp_path: Path
):
    """A changed sample file, or a hand-edited record (its provenance claims another backend), is never
    trusted: the import keeps 'unknown' for what the files do not record, and says why in its report."""
    out = tmp_path / "out"
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", fmt, str(out)))
    if damage == "file":
        _tamper_file(out, fmt)
    else:
        rec = json.loads((out / "hsstore-export.json").read_text())
        rec["provenance"]["environment"]["backend"] = "vllm"
        (out / "hsstore-export.json").write_text(json.dumps(rec))
    r = import_cache(ImportRequest(fmt, str(out), str(tmp_path / "b.zarr"), tokenizer="builtin:tiny-qwen3_5"))
    assert r["provenance"] == "imported"
    assert ("files are not the ones the export wrote" if damage == "file" else "was edited") in r["provenance_note"]
    env = _reader(tmp_path / "b.zarr").record.provenance["environment"]
    assert env["backend"] == env["device"] == "unknown"


def test_an_export_of_an_fp8_variant_imported_again_is_not_its_source(tiny_store: Path, tmp_path: Path):
    """An FP8 copy's export holds its states decoded: neither its codes nor its source's states. Its provenance was
    restored without the storage precision, so the import took the bf16 source's variant id (and, into a store
    holding the source, added FP8 values to the genuine variant). It is imported with a provenance of its own."""
    from hsstore.storage.convert import convert

    src = tmp_path / "src.zarr"
    import shutil

    shutil.copytree(tiny_store, src)
    source = Store.open(src).select("dtype=bf16")
    held = list(Store.open(src).reader(source).keys)
    fp8 = convert(f"{src}#dtype=bf16", "fp8-e4m3").variant
    export_cache(ExportRequest(f"{src}#{fp8}", "specforge", str(tmp_path / "out")))
    r = import_cache(ImportRequest("specforge", str(tmp_path / "out"), str(src), tokenizer="builtin:tiny-qwen3_5"))
    assert r["provenance"] == "imported" and "fp8-e4m3" in r["provenance_note"], r["provenance_note"]
    assert r["variant"] not in (source, fp8) and r["samples_written"] == len(held)
    assert list(Store.open(src).reader(source).keys) == held  # the source holds its own samples only

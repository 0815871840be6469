"""Damaged, odd and hostile stores: verify checks the whole tree against the format, and every reading
entry point (info, verify, gc, Store.open, readers, datasets) answers with one line naming the file —
never a traceback, a hang or an unbounded read."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
from helpers import META_DOCS, crashed_unit, garbage_metadata, new_variant, run_main, store_with_unit, write_unit

from hsstore import HiddenStateDataset, Store
from hsstore.core.errors import CorruptData, HsstoreError
from hsstore.storage.verify import verify
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import make_samples, make_states


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str, Path]:
    """A store with one committed unit (writer ``w``) and one uncommitted unit (writer ``crashed``)."""
    path = tmp_path / "s.zarr"
    s, vid, _, _ = store_with_unit(path, [6, 9, 4], seed=4, hidden=16, chunk=8)
    crashed_unit(s, vid, [3], seed=5)
    return path, vid, path / "variants" / vid / "units" / "w-000000"


def _problems(path: Path) -> list[str]:
    result = verify(Store.open(path))
    assert result.ok is (not result.problems)
    return [p.what for p in result.problems]


def _cli(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    return run_main(list(args), capsys)


def _assert_one_line(code: int, err: str, want_code: int, pattern: str) -> None:
    lines = [x for x in err.strip().splitlines() if x]
    assert code == want_code and len(lines) == 1 and lines[0].startswith("error: "), (code, err[-2000:])
    assert pattern in lines[0], lines[0]


# ---- verify: the whole tree against the format ------------------------------------------------------


@pytest.mark.parametrize("commits", [True, False], ids=["committed", "no-commits"])
@pytest.mark.parametrize("doc", sorted(META_DOCS))
def test_verify_names_every_unreadable_metadata_document(store, doc: str, commits: bool):
    """Non-JSON in a variant's zarr.json with no commits verified OK (docs/guarantees.md: garbage metadata is
    named): every metadata document is read and named when it does not parse, whatever the commit state."""
    path, vid, _ = store
    key = garbage_metadata(Store.open(path).io, vid, doc, commits)
    problems = _problems(path)
    assert any(key in p for p in problems), (key, problems)


def test_verify_names_a_root_document_that_is_not_json(store, capsys):
    path, vid, _ = store
    (path / "zarr.json").write_bytes(b"\x00garbage")
    code, err = _cli("verify", str(path), capsys=capsys)
    assert code != 0 and "zarr.json" in err, (code, err)


ODD_FILES = {
    "symlink-file": (lambda p, v, u: (u / "layer_9").symlink_to(u / "layer_0"), "is a symlink"),
    "symlink-dir-out": (lambda p, v, u: (p / "variants" / v / "builds").symlink_to("/etc"), "is a symlink"),
    "fifo": (lambda p, v, u: os.mkfifo(p / "variants" / v / "commits" / "w-000001.json"), "is a FIFO"),
    "socket": (lambda p, v, u: socket.socket(socket.AF_UNIX).bind(str(p / "variants" / "s")), "is a socket"),
    "non-json-build-record": (
        lambda p, v, u: (
            (p / "variants" / v / "builds").mkdir()
            or (p / "variants" / v / "builds" / "x.json").write_bytes(b"\x7fELF")
        ),
        "not valid JSON",
    ),
    "stray-directory": (lambda p, v, u: (u / "layer_0" / "extra").mkdir(), "has no place in the format"),
    "ds-store": (lambda p, v, u: (p / "variants" / ".DS_Store").write_bytes(b"\x00\x01Bud1"), "not written by hsstore"),
    "thumbs-db": (
        lambda p, v, u: (p / "variants" / v / "units" / "Thumbs.db").write_bytes(b"\xd0\xcf"),
        "not written by hsstore",
    ),
}


@pytest.mark.parametrize("case", sorted(ODD_FILES))
def test_verify_flags_what_hsstore_never_writes(store, case: str, capsys):
    path, vid, unit = store
    make, pattern = ODD_FILES[case]
    make(path, vid, unit)
    problems = _problems(path)
    assert any(pattern in p for p in problems), problems
    code, _ = _cli("verify", str(path), capsys=capsys)
    assert code == 1
    # the committed data itself still reads, and gc leaves the odd entry alone
    assert len(Store.open(path).reader(vid).keys) == 3
    assert _cli("gc", str(path), "--dry-run", capsys=capsys)[0] == 0


@pytest.mark.parametrize(
    "where", ["builds/b1", "variants/{v}/commits", "variants/{v}/units/w-000000/layer_0", "variants/{v}/builds"]
)
def test_a_killed_writes_temporary_file_is_debris_not_damage(store, where: str, capsys):
    """A kill can cut any atomic put short (a build record, a commit, a chunk) and leave its temporary file.
    Committed data is intact, so verify stays ok and names the file as debris; gc --force removes it."""
    path, vid, _ = store
    d = path / where.format(v=vid)
    d.mkdir(parents=True, exist_ok=True)
    (d / ".tmp-3f2a9c").write_bytes(b"half a put")
    result = verify(Store.open(path))
    assert result.ok, result.problems
    assert any("1 temporary file" in n and "gc" in n for n in result.notes), result.notes
    assert _cli("verify", str(path), capsys=capsys)[0] == 0
    assert _cli("gc", str(path), "--force", capsys=capsys)[0] == 0
    assert not (d / ".tmp-3f2a9c").exists()
    assert len(Store.open(path).reader(vid).keys) == 3


def _edit_commit(path: Path, vid: str, change) -> None:
    f = path / "variants" / vid / "commits" / "w-000000.json"
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d))


BAD_COMMITS = {
    "file-path-leaves-the-store": (lambda d: d["files"].update({"../../../../etc/passwd": 10}), "not a path inside"),
    "file-path-absolute": (lambda d: d["files"].update({"/etc/passwd": 10}), "not a path inside"),
    "covers-part-of-its-arrays": (lambda d: d["samples"].pop(), "is (19,"),
    "samples-overlap": (lambda d: d["samples"][1].__setitem__(1, 2), "starts at 2"),
    "offset-past-the-arrays": (lambda d: d["samples"][2].__setitem__(1, 40), "starts at 40"),
    "a-file-missing-from-the-record": (
        lambda d: d["files"].pop("layer_1/zarr.json") and d["xxh3"].pop("layer_1/zarr.json"),
        "not list exactly",
    ),
    "wrong-type": (lambda d: d["samples"][0].__setitem__(2, "6"), "expected an integer"),
    "negative-length": (lambda d: d["samples"][0].__setitem__(2, -6), ">= 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_COMMITS))
def test_commit_records_must_fit_the_store_and_cover_their_arrays_exactly(store, case: str):
    path, vid, _ = store
    change, pattern = BAD_COMMITS[case]
    _edit_commit(path, vid, change)
    problems = _problems(path)
    assert any(pattern in p for p in problems), problems
    with pytest.raises(
        CorruptData, match="w-000000"
    ):  # and no reader serves the unit's samples as if nothing were wrong
        r = Store.open(path).reader(vid)
        r.check_corrupt_commits()
        for k in r.keys:
            r.read(k)


# ---- every entry point: one line, no hang, no traceback ---------------------------------------------


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


SPECIAL = {
    "root-meta-fifo": (lambda p, v, u: _fifo(p / "zarr.json"), "zarr.json is a FIFO"),
    "root-meta-to-dev-zero": (
        lambda p, v, u: (p / "zarr.json").unlink() or (p / "zarr.json").symlink_to("/dev/zero"),
        "zarr.json is a symlink",
    ),
    "variant-meta-fifo": (lambda p, v, u: _fifo(p / "variants" / v / "zarr.json"), "is a FIFO"),
    "commit-fifo": (lambda p, v, u: _fifo(p / "variants" / v / "commits" / "w-000000.json"), "is a FIFO"),
    "chunk-fifo": (lambda p, v, u: _fifo(u / "layer_2" / "c" / "0" / "0"), "is a FIFO"),
    "array-meta-fifo": (lambda p, v, u: _fifo(u / "input_ids" / "zarr.json"), "is a FIFO"),
    "units-is-a-file": (
        lambda p, v, u: (
            os.rename(p / "variants" / v / "units", p / "u") or (p / "variants" / v / "units").write_text("x")
        ),
        "missing",
    ),
}


class Hang(Exception):
    pass


def _within(seconds: int, fn, *args):
    """``fn(*args)``, or Hang if it blocks longer (SIGALRM interrupts a blocking open of a FIFO too)."""

    def alarm(*_):
        raise Hang(f"{fn.__name__}{args} blocked for {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _read_dataset(path: str) -> int:
    ds = HiddenStateDataset(path)
    return len([ds[i] for i in range(len(ds))])


@pytest.mark.parametrize("case", sorted(SPECIAL))
def test_special_files_never_hang_a_reader(store, case: str, capsys):
    path, vid, unit = store
    make, pattern = SPECIAL[case]
    make(path, vid, unit)
    for cmd in (["info"], ["verify"], ["gc", "--dry-run"]):
        code, err = _within(60, lambda: _cli(cmd[0], str(path), *cmd[1:], capsys=capsys))
        assert "Traceback" not in err
        errs = [x for x in err.splitlines() if x.startswith("error:")]
        if errs or code:
            assert code in (1, 2) and len(errs) <= 1 and (errs or cmd[0] == "verify"), (cmd, code, err)
            assert not errs or pattern in errs[0] or cmd[0] != "verify", errs
    try:
        _within(60, _read_dataset, str(path))
    except HsstoreError as e:
        assert "\n" not in str(e)
    if not case.startswith("root-meta"):
        assert any(pattern in p for p in _problems(path)), _problems(path)


def test_deep_json_and_huge_records_are_refused_with_one_line(store, capsys):
    path, vid, _ = store
    meta = path / "variants" / vid / "zarr.json"
    good = meta.read_bytes()
    meta.write_text("[" * 100_000 + "]" * 100_000)
    _assert_one_line(*_cli("info", str(path), capsys=capsys), 1, "is not valid JSON")
    meta.write_text(json.dumps({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}))
    _assert_one_line(*_cli("info", str(path), capsys=capsys), 1, "nests deeper than 32")
    meta.write_bytes(good)
    commit = path / "variants" / vid / "commits" / "w-000000.json"
    with open(commit, "r+b") as f:
        f.truncate(65 << 20)  # sparse: 65 MiB of zeros, above the cap of any record
    problems = verify(Store.open(path)).problems
    assert any("more than the" in p.what for p in problems), problems


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("hidden_size", "16", "hidden_size = '16': expected an integer"),
        ("hidden_size", 0, "hidden_size = 0"),
        ("layers", {"aux": [0, 1]}, "layers"),
        ("layers", {"aux": [0, 1], "target": ["2"]}, "expected an integer"),
        ("provenance", {"recipe": [1], "environment": {}}, "provenance.recipe` must be a table"),
        ("id", "0123456789ab", "names variant '0123456789ab', not its directory"),
        ("codec", "lzma", "codec 'lzma'"),
        ("chunk_tokens", True, "expected an integer"),
    ],
    ids=[
        "size-as-string",
        "size-zero",
        "role-missing",
        "layer-as-string",
        "provenance-not-a-table",
        "record-of-another-variant",
        "codec-unknown",
        "bool-for-int",
    ],
)
def test_wrong_types_in_variant_attributes_are_one_line(store, capsys, field: str, value, pattern: str):
    path, vid, _ = store
    f = path / "variants" / vid / "zarr.json"
    d = json.loads(f.read_text())
    d["attributes"]["hsstore_variant"][field] = value
    f.write_text(json.dumps(d))
    _assert_one_line(*_cli("info", str(path), capsys=capsys), 1, pattern)
    with pytest.raises(CorruptData, match=re.escape(pattern)):
        HiddenStateDataset(path)
    assert not verify(Store.open(path)).ok


@pytest.mark.parametrize("value", [None, 5, True, ["x"]])
def test_a_tokenizer_fingerprint_of_another_type_is_one_line(store, capsys, value):
    """Found by the long fuzz run (scripts/fuzz_store.sh): every sample key hashes this string."""
    path, vid, _ = store
    f = path / "variants" / vid / "zarr.json"
    d = json.loads(f.read_text())
    d["attributes"]["hsstore_variant"]["provenance"]["recipe"]["tokenizer"]["fingerprint"] = value
    f.write_text(json.dumps(d))
    _assert_one_line(*_cli("info", str(path), capsys=capsys), 1, "tokenizer.fingerprint` must be a string")
    with pytest.raises(CorruptData, match="tokenizer.fingerprint` must be a string"):
        HiddenStateDataset(path)
    assert not verify(Store.open(path)).ok


def test_a_store_path_with_a_hash_works_end_to_end(tmp_path: Path, capsys):
    path = tmp_path / "runs#3" / "s#1.zarr"
    _, vid, _, _ = store_with_unit(path, [5, 7])
    code, err = _cli("verify", str(path), capsys=capsys)
    assert code == 0, err
    assert _cli("info", str(path), "--json", capsys=capsys)[0] == 0
    assert len(HiddenStateDataset(str(path))) == 2
    assert len(HiddenStateDataset(f"{path}#dtype=bf16")) == 2  # a selector after the last '#'
    assert len(HiddenStateDataset(f"{path}#{vid[:6]}")) == 2
    assert Store.open(path).variants[0].n_samples == 2


def test_swapped_files_of_one_size_are_named_by_verify(tmp_path: Path):
    """Two layers' shard files of one unit swapped (a botched copy): each still decodes, chunk checksums and all, and
    a reader would serve layer 0's states as layer 1's. Every chunk and the shard index end with their own crc32c,
    so a crc32c of the whole file depends only on where those blocks end: the files' own checksums recorded at commit
    must tell them apart (xxh3), and verify must name both files."""
    path = tmp_path / "s.zarr"
    _, vid, _, _ = store_with_unit(path, [40, 24], seed=3, hidden=32, chunk=8, codec="none")  # one size per layer
    unit = next((path / "variants" / vid / "units").glob("w-*"))
    a, b = unit / "layer_0" / "c" / "0" / "0", unit / "layer_1" / "c" / "0" / "0"
    assert a.stat().st_size == b.stat().st_size
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)
    found = _problems(path)
    assert any("layer_0/c/0/0" in p for p in found) and any("layer_1/c/0/0" in p for p in found), found


def test_commit_records_of_before_xxh3_still_verify_by_their_crc32c(tmp_path: Path):
    """A store written before 2026-12-07 records crc32c per file: it verifies as before (a changed byte is named by
    that checksum), and a record that names a checksum of the wrong length for its kind is refused."""
    import crc32c

    path = tmp_path / "s.zarr"
    _, vid, _, _ = store_with_unit(path, [40, 24], seed=3, hidden=32, chunk=8, codec="none")
    (commit,) = (path / "variants" / vid / "commits").glob("*.json")
    unit = path / "variants" / vid / "units" / commit.stem
    rec = json.loads(commit.read_text())
    rec["crc32c"] = {rel: f"{crc32c.crc32c((unit / rel).read_bytes()):08x}" for rel in rec.pop("xxh3")}
    commit.write_text(json.dumps(rec))
    assert _problems(path) == []
    meta = unit / "layer_1" / "zarr.json"
    meta.write_text(meta.read_text().replace('"layer": 1', '"layer": 7'))  # same size, other bytes
    assert any("layer_1/zarr.json has crc32c" in p for p in _problems(path))
    rec["crc32c"]["layer_1/zarr.json"] = "0" * 16
    commit.write_text(json.dumps(rec))
    assert any("unreadable" in p and "crc32c of 'layer_1/zarr.json'" in p for p in _problems(path))


def test_execute_bits_are_a_note_not_damage(tmp_path: Path, capsys):
    """Every file of a healthy store made executable (``chmod -R 775``, a CIFS or exFAT mount): no byte a reader reads
    changed, so verify passes (it named each file a problem and exited 1) and notes the mode bits once."""
    path = tmp_path / "s.zarr"
    store_with_unit(path, [6, 9, 4], seed=4, hidden=16, chunk=8)
    files = [f for f in path.rglob("*") if f.is_file()]
    for f in files:
        f.chmod(0o775)
    result = verify(Store.open(path))
    assert result.ok and not result.problems, result.problems
    assert any(f"{len(files)} file(s) are executable" in n for n in result.notes), result.notes
    assert _cli("verify", str(path), capsys=capsys)[0] == 0


def test_units_and_records_carry_their_variant_and_a_unit_copied_across_is_named(tmp_path: Path):
    """Two variants of the same samples: a unit and its commit record copied from B into A in place of A's own (two
    stores merged by hand) were consistent in every size and checksum, so verify passed and A served B's states. The
    record names its variant, so the copy is refused by verify and by readers."""
    import shutil

    path = tmp_path / "s.zarr"
    s, va, samples, _ = store_with_unit(path, [6, 9, 4], seed=4, hidden=16, chunk=8, backend="a")
    vb = new_variant(s, hidden=16, chunk=8, backend="b")
    write_unit(s, vb, [6, 9, 4], seed=4, writer_id="wb")
    (ca,) = (path / "variants" / va / "commits").glob("*.json")
    (cb,) = (path / "variants" / vb / "commits").glob("*.json")
    assert json.loads(ca.read_text())["variant"] == va
    shutil.rmtree(path / "variants" / va / "units" / ca.stem)
    ca.unlink()
    shutil.copytree(path / "variants" / vb / "units" / cb.stem, path / "variants" / va / "units" / cb.stem)
    shutil.copy(cb, path / "variants" / va / "commits" / cb.name)
    assert any(f"commits to variant {vb}, not {va}" in p for p in _problems(path))
    with pytest.raises(CorruptData, match=f"commits to variant {vb}"):
        Store.open(path).reader(va).read(samples[0].key)


def test_a_record_whose_checksums_leave_a_file_out_is_refused(store):
    """A record with an xxh3 map that skips a file (an edit that strips one checksum) would leave that file unchecked."""
    path, vid, _ = store
    _edit_commit(path, vid, lambda d: d["xxh3"].pop("layer_1/c/0/0"))
    assert any("holds no xxh3 for ['layer_1/c/0/0']" in p for p in _problems(path))


def test_files_replaced_with_a_fixed_up_record_are_named_by_their_values(tmp_path: Path):
    """Layer 2's shard replaced by another variant's and the record's size and xxh3 fixed up to match: every check of
    bytes passes, but the values are not the ones whose min and max the record holds; verify names the unit."""
    import xxhash

    path = tmp_path / "s.zarr"
    s, va, samples, _ = store_with_unit(path, [40, 24], seed=3, hidden=32, chunk=8, codec="none", backend="a")
    vb = new_variant(s, hidden=32, chunk=8, codec="none", backend="b")
    UnitWriter(s, vb, writer_id="wb").write(samples, make_states(samples, 32, "bf16", [0, 1, 2], seed=9))
    (ca,) = (path / "variants" / va / "commits").glob("*.json")
    (cb,) = (path / "variants" / vb / "commits").glob("*.json")
    mine = path / "variants" / va / "units" / ca.stem / "layer_2" / "c" / "0" / "0"
    theirs = path / "variants" / vb / "units" / cb.stem / "layer_2" / "c" / "0" / "0"
    rec = json.loads(ca.read_text())
    data = bytearray(theirs.read_bytes())
    mine.write_bytes(bytes(data))
    rec["xxh3"]["layer_2/c/0/0"] = xxhash.xxh3_64_hexdigest(bytes(data))
    ca.write_text(json.dumps(rec))
    found = _problems(path)
    assert found and all("layer 2 holds" in p and "not the states committed" in p for p in found), found


def test_the_writer_refuses_an_empty_sample(tmp_path: Path):
    """A sample of 0 tokens was committed, and verify then condemned its whole unit, healthy samples too: the writer
    refuses it and commits nothing."""
    s = Store.create(tmp_path / "s.zarr")
    vid = new_variant(s, hidden=16, chunk=8)
    samples = make_samples([0, 1, 5], seed=1)
    with pytest.raises(ValueError, match="has no tokens"):
        UnitWriter(s, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2], seed=1))
    assert Store.open(tmp_path / "s.zarr").reader(vid).keys == []


def test_a_variant_record_edited_after_the_fact_is_noted(store):
    """The model's name edited in a variant's record (sed over zarr.json): its provenance no longer hashes to the
    variant's id, and info and the selectors would present the states under the new name. verify notes it (a note:
    a store written by a version that hashed other fields would read the same)."""
    path, vid, _ = store
    meta = path / "variants" / vid / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["hsstore_variant"]["provenance"]["recipe"]["model"]["name"] = "another-model"
    meta.write_text(json.dumps(doc))
    result = verify(Store.open(path))
    assert any(f"variant {vid}: its provenance hashes to" in n for n in result.notes), result.notes

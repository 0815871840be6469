"""Data lineage: every build leaves its records in the store (appended, never replaced), naming the
manifest as resolved, the data files' hashes, its counts and outcome, and every row it did not take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash
from helpers import DATA, REPO, run_cli, write_manifest

from hsstore import Store
from hsstore.core.schema.build import BuildRecord
from hsstore.storage.verify import verify

STANDIN = str(REPO / "tests" / "standin")


def _data(tmp: Path) -> Path:
    rows = DATA.read_text().splitlines()[:6]
    rows += [rows[0], '{"messages": "not a list"}', '{"foo": 1}']  # row 7 duplicate, 8 and 9 rejected
    p = tmp / "rows.jsonl"
    p.write_text("\n".join(rows) + "\n")
    return p


def _records(store: Path) -> dict[str, dict[str, BuildRecord]]:
    """build id -> {"r0-start": record, ...}, decoded strictly."""
    out: dict[str, dict[str, BuildRecord]] = {}
    for f in sorted(store.glob("builds/*/r*-*.json")):
        out.setdefault(f.parent.name, {})[f.stem] = BuildRecord.from_json(f.read_bytes(), str(f))
    return out


def test_each_build_appends_its_records_and_names_every_row_it_did_not_take(tmp_path: Path):
    data = _data(tmp_path)
    m = write_manifest(
        tmp_path / "m.toml",
        model="builtin:tiny-llama",
        layers="{ aux = [1], target = [2] }",
        files=[str(data)],
        store=str(tmp_path / "s.zarr"),
        dtypes='["fp32"]',
    )
    r = run_cli("build", str(m), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (build_id,) = _records(tmp_path / "s.zarr")
    assert out["build_id"] == build_id and Path(out["build_record"]).is_file()
    rows = [json.loads(line) for line in Path(out["rows_report"]).read_text().splitlines()]
    assert f"each named in {out['rows_report']}" in r.stderr  # summarized on stderr

    named = {(x["row"], x["kind"]) for x in rows if x["kind"] != "truncated"}
    assert named == {(7, "duplicate"), (8, "rejected"), (9, "rejected")}
    assert all(x["file"] == str(data) and x["reason"] for x in rows)
    assert sum(x["kind"] == "truncated" for x in rows) == out["inputs"]["truncated"] > 0
    # replies that truncation dropped whole: counted on the summary line and named per row
    dropped = sum(int(x["detail"].split("; ")[1].split()[0]) for x in rows if "dropped whole" in x.get("detail", ""))
    assert out["inputs"]["replies_dropped"] == dropped
    from hsstore.cli.build_cmd import _lines, _rows_line
    from hsstore.core.schema.build import BuildResult

    for n in {dropped, dropped + 3}:  # the summary as the CLI renders it, for this build and one that dropped more
        summary = BuildResult.from_dict({**out, "inputs": {**out["inputs"], "replies_dropped": n}}, "summary")
        said = f"({n} repl{'y' if n == 1 else 'ies'} dropped whole: raise [data] max_length to keep them)"
        assert (said in _lines(summary)[1] and said in _rows_line(summary)) == (n > 0)
        assert (said in r.stdout + r.stderr) == (n == dropped > 0)
        # in text, the summary names the rows report under its inputs line (once: no second inputs line)
        assert _lines(summary)[2] == f"  rows not taken as they were, each with its reason: {out['rows_report']}"

    recs = _records(tmp_path / "s.zarr")[build_id]
    start, end = recs["r0-start"], recs["r0-end"]
    assert start.outcome == "running" and start.finished_at is None
    assert end.outcome == "succeeded" and end.error is None and end.finished_at >= end.started_at
    assert end.manifest.data_files == [str(data)] and end.manifest.store_path == str(tmp_path / "s.zarr")
    (f,) = end.data_files
    assert (f.path, f.size, f.xxh3_128) == (
        str(data),
        data.stat().st_size,
        xxhash.xxh3_128_hexdigest(data.read_bytes()),
    )
    assert (end.world_size, end.samples, end.share_samples) == (1, 6, 6) and end.inputs.rows == 9
    (v,) = end.variants
    assert end.committed == {v.variant: 6} and end.complete == {v.variant: True}
    assert end.recipe.to_dict() == Store.open(tmp_path / "s.zarr").variants[0].provenance["recipe"]

    first = {p: p.read_bytes() for p in (tmp_path / "s.zarr" / "builds").rglob("*") if p.is_file()}
    data.write_text(data.read_text() + DATA.read_text().splitlines()[10] + "\n")  # one more row
    r = run_cli("build", str(m), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert len(_records(tmp_path / "s.zarr")) == 2  # appended ...
    assert all(p.read_bytes() == b for p, b in first.items())  # ... nothing replaced
    assert verify(Store.open(tmp_path / "s.zarr")).ok  # the records are files hsstore writes


@pytest.mark.process
def test_a_failed_build_records_how_it_ended(tmp_path: Path):
    m = write_manifest(tmp_path / "m.toml", store=str(tmp_path / "s.zarr"))
    r = run_cli("build", str(m), "--limit", "3", "--quiet", "--backend", "fla", env={"PYTHONPATH": STANDIN})
    # --backend fla binds the stand-in fla kernels (forced in the worker, tests/scenarios/test_build.py forces torch over
    # them): they are called, and refuse to run
    assert r.returncode == 1 and "stand-in" in r.stderr and "kernel called" in r.stderr
    ((_, recs),) = _records(tmp_path / "s.zarr").items()
    end = recs["r0-end"]
    assert end.outcome == "failed" and "stand-in" in end.error and end.variants == []
    assert end.manifest.backends == ["fla"]

"""diff --align: names what each layer of a foreign-convention cache really holds — off by one (the
state entering layer i) and pre- vs post-final-norm — against a native build of the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli, write_manifest

from hsstore import Store
from hsstore.core.keys import SampleTokens
from hsstore.storage.writer import UnitWriter


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A native fp32 build of tiny-llama storing every decoder layer's output and the final norm's."""
    d = tmp_path_factory.mktemp("native")
    m = write_manifest(
        d / "m.toml",
        model="builtin:tiny-llama",
        dtypes='["fp32"]',
        layers='{ aux = [0, 1, 2], target = [3, "final_norm"] }',
    )
    r = run_cli("build", str(m), "--limit", "16", "--quiet")
    assert r.returncode == 0, r.stderr
    return d / "store.zarr"


def _foreign(native: Path, dest: Path, labels: dict[int, int]) -> str:
    """An 'imported' bf16 cache (capture unknown) whose layer ``label`` holds the native layer
    ``labels[label]``, rounded to bf16 as another runtime would have computed it."""
    src = Store.open(native)
    r = src.reader(src.select(None))
    prov = json.loads(json.dumps(r.record.provenance))
    prov["recipe"]["capture"] = "unknown"
    prov["environment"]["dtype"] = "bf16"
    ids = sorted(labels)
    layers = {"aux": ids[:-1], "target": ids[-1:]}
    prov["recipe"]["layers"] = layers
    store = Store.create(dest)
    vid = store.create_variant(prov, layers, r.record.hidden_size, "bf16", "zstd", 64)
    w = UnitWriter(store, vid)
    for key in r.keys:
        ids_, mask = r.read_tokens(r.refs[key])
        states = r.read_layers(r.refs[key], [labels[i] for i in ids])
        w.write([SampleTokens(key, ids_, mask)], {i: s.bfloat16() for i, s in zip(ids, states)})
    return str(dest)


def _align(a: str, b: str) -> tuple[int, dict, str]:
    r = run_cli("diff", a, b, "--align", "--json", "-")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}), r.stderr


def test_labels_that_are_right_are_confirmed(native: Path, tmp_path: Path):
    a = _foreign(native, tmp_path / "ok.zarr", {0: 0, 1: 1, 2: 2, 3: 3, 4: 4})
    code, rep, err = _align(a, str(native))
    assert code == 0, err
    assert rep["ok"] and [L["relation"] for L in rep["layers"]] == ["as_labelled"] * 5
    assert all(L["rel_l2"] < 0.01 and L["runner_up_rel_l2"] > 2 * L["rel_l2"] for L in rep["layers"])


def test_input_convention_is_named_off_by_one_and_last_state_pre_norm(native: Path, tmp_path: Path):
    """vLLM-style labels: aux layer i holds the state entering layer i (= output of i-1), and the last
    state (labelled L, the final norm's id) is the last decoder layer's pre-norm output."""
    a = _foreign(native, tmp_path / "vllm.zarr", {1: 0, 2: 1, 3: 2, 4: 3})
    code, rep, err = _align(a, str(native))
    assert code == 1 and "not what their labels say" in err
    by = {L["layer"]: L for L in rep["layers"]}
    assert [by[i]["relation"] for i in (1, 2, 3)] == ["off_by_one"] * 3
    assert [by[i]["match"] for i in (1, 2, 3)] == [0, 1, 2]
    assert by[4]["relation"] == "pre_norm" and by[4]["match"] == 3
    assert "OFF BY ONE" in rep["summary"] and "PRE-norm" in rep["summary"]


def test_post_norm_labelled_as_last_layer(native: Path, tmp_path: Path):
    a = _foreign(native, tmp_path / "hf.zarr", {1: 1, 3: 4})
    code, rep, _ = _align(a, str(native))
    by = {L["layer"]: L for L in rep["layers"]}
    assert code == 1 and by[1]["relation"] == "as_labelled"
    assert by[3]["relation"] == "post_norm" and by[3]["match"] == 4


def test_unknown_capture_aligns_automatically(native: Path, tmp_path: Path):
    a = _foreign(native, tmp_path / "auto.zarr", {1: 0, 2: 1, 3: 2, 4: 3})
    r = run_cli("diff", a, str(native))
    assert r.returncode == 1
    assert "capture point is 'unknown'" in r.stdout and "OFF BY ONE" in r.stdout
    assert "rel-L2 of A's layer against each of B's" in r.stdout


def test_align_does_not_load_the_compiled_loops(native: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Align reads only the sums of each layer pair, never the count or max |d| the compiled loops give:
    loading them would add ~1 s of numba set-up to a diff whose capture point is unknown."""
    from hsstore.compare import kernel
    from hsstore.compare.align import run_align

    loaded: list[bool] = []
    real = kernel.compiled_kernel
    monkeypatch.setattr(kernel, "compiled_kernel", lambda: loaded.append(True) or real())
    a = _foreign(native, tmp_path / "ok.zarr", {0: 0, 1: 1, 2: 2, 3: 3, 4: 4})
    assert run_align(a, str(native)).ok and not loaded

"""A foreign cache imported with a wrong ``--layers``/``--capture`` statement: the audit names each slot that
holds another layer than stated, and says the statement that would have been right, in the tool's own
numbering; a right statement audits clean. The caches are hsstore exports with their export record
removed (nothing in the files then says which layers they hold: the user states it, as for a real
SpecForge, speculators/vLLM, Model-Optimizer or EAGLE cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli
from interop_damage import sidecar, subset

from hsstore import Store
from hsstore.interop.exporter import ExportRequest, export_cache

MODEL = "builtin:tiny-qwen3_5"
FORMATS = ("specforge", "speculators", "modelopt", "eagle")


@pytest.fixture(scope="module")
def foreign(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bf16 variant's two shortest samples in each peer layout, with no export record. The files hold
    hsstore layers 0, 1 (aux) and 3 (target: the last layer's output, pre-norm) of the 4-layer model."""
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    picks = sorted(enumerate(r.keys), key=lambda ik: (r.refs[ik[1]].length, ik[1]))[:2]
    root = tmp_path_factory.mktemp("foreign")
    out = {}
    for fmt in FORMATS:
        export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", fmt, str(root / "full" / fmt)))
        out[fmt] = subset(fmt, root / "full" / fmt, root / fmt, picks)
        sidecar(fmt, out[fmt]).unlink(missing_ok=True)
    return out


# (format, --layers, --capture as the user stated them) -> (slots named capture_point: the point each holds,
# the right statement in the tool's numbering, or None when the stated one is right)
CASES = {
    "vllm-ids-stated-as-outputs": ("speculators", "1,2,3", "output", {1: 0, 2: 1}, "--layers 1,2,4 --capture input"),
    "vllm-ids-numbering-unknown": (
        "speculators",
        "1,2,4",
        "unknown",
        {1: 0, 2: 1, 4: 3},
        "--layers 1,2,4 --capture input",
    ),
    "vllm-right": ("speculators", "1,2,4", "input", {}, None),
    "pre-norm-target-stated-final-norm": (
        "specforge",
        "0,1,final_norm",
        "output",
        {4: 3},
        "--layers 0,1,3 --capture output",
    ),
    "one-based-ids-stated-as-outputs": (
        "specforge",
        "1,2,3",
        "output",
        {1: 0, 2: 1},
        "--layers 0,1,3 --capture output",
    ),
    "ids-one-too-high-as-input": ("modelopt", "2,3,4", "input", {1: 0, 2: 1}, "--layers 0,1,3 --capture output"),
    "one-wrong-aux-id": ("modelopt", "0,2,3", "output", {2: 1}, "--layers 0,1,3 --capture output"),
    "eagle-pre-norm-stated-final-norm": ("eagle", "final_norm", "output", {4: 3}, "--layers 3 --capture output"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_audit_names_a_wrong_statement_and_the_right_one(case: str, foreign: dict[str, Path], tmp_path: Path):
    fmt, layers, capture, held, right = CASES[case]
    store = str(tmp_path / "s.zarr")
    r = run_cli(
        "import",
        fmt,
        str(foreign[fmt]),
        "--store",
        store,
        "--tokenizer",
        MODEL,
        "--model",
        MODEL,
        "--layers",
        layers,
        "--capture",
        capture,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("check", MODEL, store, "--samples", "2", "--json", "-")
    rep = json.loads(r.stdout)
    found = {(f["key"], f["layer"]): f for f in rep["findings"]}
    assert {f["kind"] for f in found.values()} <= {"capture_point"}, rep["findings"]
    for v in rep["sample_verdicts"]:  # every sample: the wrongly labelled slots, each with what it holds
        assert {L: found[(v["key"], L)]["match"] for L in held} == held
        assert all(k in ("bit_exact", "within_noise") for L, k in v["layers"].items() if int(L) not in held), v
    if right is None:
        assert r.returncode == 0 and "restatement" not in rep and rep["verdict"].startswith("AGREES"), rep["verdict"]
        return
    assert (
        rep["restatement"]["flags"] == right
        and rep["restatement"]["stated"] == f"--layers {layers} --capture {capture}"
    )
    assert right in rep["verdict"] and (r.returncode == 1) == bool(held), rep["verdict"]
    store2 = str(tmp_path / "restated.zarr")  # the statement it names imports a cache that audits clean
    r = run_cli(
        "import",
        fmt,
        str(foreign[fmt]),
        "--store",
        store2,
        "--tokenizer",
        MODEL,
        "--model",
        MODEL,
        *right.split(),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("check", MODEL, store2, "--samples", "2", "--json", "-")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["findings"] == [] and "restatement" not in rep, rep["verdict"]

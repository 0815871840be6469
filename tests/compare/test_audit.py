"""``hsstore check`` as an audit of imported caches: a native store exported to a peer tool's layout,
damaged the way that tool's bugs damage it, imported, and audited against the model — every defect named
with its sample and layers; a clean export audits clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import main_exit, run_cli, save_local_model
from interop_damage import damage, sample_file, subset

from hsstore import Store
from hsstore.compare.audit import AuditRequest, run_audit
from hsstore.compare.defects import CLEAN
from hsstore.interop.exporter import ExportRequest, export_cache
from hsstore.interop.importer import ImportRequest, import_cache

MODEL = "builtin:tiny-qwen3_5"
AUX0, AUX1, TARGET, NORM = 0, 1, 3, 4  # tiny_store's aux [0, 1] and target [3]; 4 = after the final norm (4 layers)
ALL = (AUX0, AUX1, TARGET)


@pytest.fixture(scope="module")
def source(tiny_store: Path) -> tuple[list[str], dict[str, int]]:
    """The bf16 variant's keys in commit order (the export's file order) and their lengths."""
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    return list(r.keys), {k: r.refs[k].length for k in r.keys}


@pytest.fixture(scope="module")
def exports(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bf16 variant written once in each peer layout by ``hsstore export``."""
    root = tmp_path_factory.mktemp("exports")
    for fmt in ("specforge", "modelopt", "speculators", "eagle"):
        export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", fmt, str(root / fmt)))
    return {fmt: root / fmt for fmt in ("specforge", "modelopt", "speculators", "eagle")}


def _shortest(source: tuple[list[str], dict[str, int]], n: int) -> list[tuple[int, str]]:
    keys, lengths = source
    return sorted(enumerate(keys), key=lambda ik: (lengths[ik[1]], ik[1]))[:n]


def _audit(fmt: str, folder: Path, tmp: Path, n: int) -> dict:
    store = tmp / f"{fmt}.zarr"
    import_cache(ImportRequest(fmt, str(folder), str(store), tokenizer=MODEL, allow_unhealthy=True))
    return run_audit(AuditRequest(model=MODEL, target=str(store), samples=n)).to_dict()


def _final_norm(x: torch.Tensor) -> torch.Tensor:
    """The model's final norm applied to stored states (what a post-norm capture stores)."""
    from hsstore.capture.model.placement import final_norm
    from hsstore.capture.model.spec import ModelSpec

    model = ModelSpec(MODEL).load(torch.float32, "cpu", "sdpa")
    with torch.no_grad():
        return final_norm(model, 4)(x.float()[None])[0].to(x.dtype)


def _set(aux: torch.Tensor | None, target: torch.Tensor, layer: int, value: torch.Tensor) -> tuple:
    if layer == TARGET:
        return aux, value
    aux = aux.clone()
    aux[:, layer] = value
    return aux, target


def _rows(t: torch.Tensor, rows: slice, value: float) -> torch.Tensor:
    t = t.clone()
    t[rows] = value
    return t


# defect -> (how the peer's bug writes it, the layers it must be named on, what else the finding says)
SEEDED = {
    "nan": (lambda a, t: (a, _rows(t, slice(5, 9), float("nan"))), (TARGET,), {"rows": [5, 6, 7, 8]}),
    "inf": (lambda a, t: _set(a, t, AUX0, _rows(a[:, AUX0], slice(2, 3), float("inf"))), (AUX0,), {"rows": [2]}),
    "all_zero": (lambda a, t: (a, torch.zeros_like(t)), (TARGET,), {}),
    "constant": (lambda a, t: _set(a, t, AUX1, torch.full_like(a[:, AUX1], 0.5)), (AUX1,), {}),
    "suffix_states": (
        lambda a, t: (_rows(a, slice(0, 10), 0.0), _rows(t, slice(0, 10), 0.0)),
        ALL,
        {"rows": list(range(10))},
    ),
    "token_shift": (lambda a, t: (torch.roll(a, 1, 0), torch.roll(t, 1, 0)), ALL, {"match": 1}),
    "capture_point": (lambda a, t: _set(a, t, AUX1, a[:, AUX0]), (AUX1,), {"match": AUX0}),  # off by one
    "post_norm": (lambda a, t: (a, _final_norm(t)), (TARGET,), {"match": NORM}),
    "aux_equals_target": (lambda a, t: _set(a, t, AUX1, t), (AUX1,), {}),
    "beyond_noise": (
        lambda a, t: (
            a,
            t + 0.05 * t.float().std() * torch.randn(t.shape, generator=torch.Generator().manual_seed(0)).to(t.dtype),
        ),
        (TARGET,),
        {},
    ),
}
KIND = {"post_norm": "capture_point"}
AUX_ONLY = {"inf", "constant", "capture_point", "aux_equals_target"}


@pytest.fixture(scope="module", params=["specforge", "speculators"])
def damaged(request: pytest.FixtureRequest, exports: dict[str, Path], source, tmp_path_factory) -> tuple:
    """One export per format with every defect seeded into its own sample (the shortest samples, for speed),
    two samples left clean, and one sample's states replaced by another's (a stale slot): imported, audited."""
    fmt = request.param
    picks = _shortest(source, len(SEEDED) + 3)
    tmp = tmp_path_factory.mktemp(f"damaged-{fmt}")
    folder = subset(fmt, exports[fmt], tmp / fmt, picks)
    plan = dict(zip(SEEDED, picks[1:]))  # picks[0] and picks[-1] stay clean
    for name, (index, key) in plan.items():
        damage(fmt, sample_file(fmt, folder, index, key), SEEDED[name][0])
    (si, sk), (li, lk) = picks[-2], picks[-1]  # the second longest holds the longest one's first rows
    stale_from = {}

    def copy_rows(a: torch.Tensor | None, t: torch.Tensor) -> tuple:
        from interop_damage import read_slots

        _, a2, t2 = read_slots(fmt, sample_file(fmt, folder, li, lk))
        return (None if a is None else a2[: a.shape[0]].clone()), t2[: t.shape[0]].clone()

    damage(fmt, sample_file(fmt, folder, si, sk), copy_rows)
    stale_from[sk] = lk
    report = _audit(fmt, folder, tmp, len(picks))
    return fmt, report, plan, stale_from, [picks[0][1], lk]


def _findings(report: dict, key: str) -> dict[int, dict]:
    return {f["layer"]: f for f in report["findings"] if f["key"] == key}


@pytest.mark.parametrize("defect", sorted(SEEDED))
def test_each_seeded_defect_is_named_on_its_sample_and_layers(damaged: tuple, defect: str):
    fmt, report, plan, _, _ = damaged
    key = plan[defect][1]
    _, layers, facts = SEEDED[defect]
    found = _findings(report, key)
    verdict = next(v for v in report["sample_verdicts"] if v["key"] == key)
    assert set(found) == set(layers), (fmt, defect, verdict, found)
    for layer in layers:
        f = found[layer]
        assert f["kind"] == KIND.get(defect, defect), (fmt, defect, f)
        for name, want in facts.items():
            assert f[name] == want, (fmt, defect, f)
    clean = {L: k for L, k in verdict["layers"].items() if int(L) not in layers}
    assert all(k in CLEAN for k in clean.values()), (fmt, defect, verdict)  # the other layers are not blamed


def test_a_stale_slot_names_the_sample_its_rows_came_from(damaged: tuple):
    fmt, report, _, stale_from, _ = damaged
    for key, source_key in stale_from.items():
        found = _findings(report, key)
        assert set(found) == set(ALL) and {f["kind"] for f in found.values()} == {"stale_copy"}, (fmt, found)
        assert {f["source"] for f in found.values()} == {source_key}


def test_the_report_counts_defective_samples_and_says_what_n_bounds(damaged: tuple):
    fmt, report, plan, stale_from, clean = damaged
    n_bad = len(plan) + len(stale_from)
    assert report["samples"] == report["population"] == n_bad + len(clean)
    assert report["defective_samples"] == n_bad and report["verdict_kind"] == "beyond_noise"
    assert report["verdict"].startswith(f"DEFECTS in {n_bad} of {report['samples']}")
    for key in clean:  # the untouched samples (one is the stale copy's source) agree
        assert next(v for v in report["sample_verdicts"] if v["key"] == key)["verdict"] in CLEAN
    assert report["defect_rate_upper"] == pytest.approx(n_bad / report["samples"])  # every sample: the rate itself
    assert set(report["assumed"]) == {"device", "backend", "attn", "batching"} and report["floor"].startswith("live")
    if fmt == "speculators":  # Arrow rows whose states file is not in the subset: said, since no audit sees them
        assert any(
            "left out 0 file(s)" in n and f"{40 - report['population']} row(s) without a states file" in n
            for n in report["notes"]
        ), report["notes"]


@pytest.mark.parametrize("fmt", ["modelopt", "eagle"])
def test_a_clean_export_audits_clean(fmt: str, exports: dict[str, Path], source, tmp_path: Path):
    picks = _shortest(source, 3)
    report = _audit(fmt, subset(fmt, exports[fmt], tmp_path / fmt, picks), tmp_path, 2)
    assert report["verdict_kind"] in ("identical", "within_noise") and report["findings"] == [], report["findings"]
    assert report["defective_samples"] == 0 and report["verdict"].startswith("AGREES")
    assert report["defect_rate_upper"] == pytest.approx(1 - 0.05 ** (1 / 2))  # 2 of 3 drawn: 0 of 2 bounds it


def _other_weights(fmt: str, folder: Path, picks: list[tuple[int, str]], tiny_store: Path) -> None:
    """Every sample's states recomputed by a model of other weights (the builtin drawn from seed 1)."""
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.capture.run.hooks import LayerCapture

    model = ModelSpec(MODEL, seed=1).load(torch.bfloat16, "cpu", "sdpa")
    cap = LayerCapture(model, 4, list(ALL))
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    for index, key in picks:
        ids = torch.from_numpy(r.read_tokens(r.refs[key])[0].astype("int64"))[None]
        out = cap.run(ids, torch.ones_like(ids))
        damage(
            fmt,
            sample_file(fmt, folder, index, key),
            lambda a, t: (torch.stack([out[AUX0][0], out[AUX1][0]], 1), out[TARGET][0]),
        )
    cap.close()


@pytest.fixture(scope="module")
def other_weights_store(exports: dict[str, Path], source, tiny_store: Path, tmp_path_factory) -> Path:
    """A modelopt export whose states are another checkpoint's, imported (used by the CLI test too)."""
    tmp = tmp_path_factory.mktemp("other-weights")
    picks = _shortest(source, 3)
    folder = subset("modelopt", exports["modelopt"], tmp / "modelopt", picks)
    _other_weights("modelopt", folder, picks, tiny_store)
    import_cache(ImportRequest("modelopt", str(folder), str(tmp / "s.zarr"), tokenizer=MODEL))
    return tmp / "s.zarr"


def test_states_of_other_weights_are_named(exports: dict[str, Path], source, tiny_store: Path, tmp_path: Path):
    picks = _shortest(source, 3)
    folder = subset("specforge", exports["specforge"], tmp_path / "specforge", picks)
    _other_weights("specforge", folder, picks, tiny_store)
    report = _audit("specforge", folder, tmp_path, 3)
    assert report["defects"] == {"other_weights": 3}
    assert {(f["key"], f["layer"]) for f in report["findings"]} == {(k, L) for _, k in picks for L in ALL}


def test_cli_exit_codes_and_json(other_weights_store: Path, tmp_path: Path, capsys):
    """Exit 1 and the same facts in --json for a defective cache (a real subprocess); exit 2, one line, for
    a model that cannot produce the stored shapes — refused from its config alone (this one has no weights)."""
    r = run_cli("check", MODEL, str(other_weights_store), "--samples", "3", "--json", "-")
    assert r.returncode == 1, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["defects"] == {"other_weights": 3} and rep["defective_samples"] == 3
    assert [e for e in r.stderr.splitlines() if e.startswith("error:")] == [
        f"error: live states do not match the store: {rep['verdict']}"
    ]
    narrow = save_local_model(tmp_path / "narrow", arch="tiny-llama")
    for f in narrow.glob("*.safetensors"):
        f.unlink()  # config only: refused before any weights would load
    cfg = json.loads((narrow / "config.json").read_text())
    cfg["hidden_size"] = cfg["hidden_size"] * 2
    (narrow / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main_exit(["check", str(narrow), str(other_weights_store)]) == 2
    err = [e for e in capsys.readouterr().err.splitlines() if e.strip()]
    assert len(err) == 1 and "hidden_size" in err[0] and "cannot produce" in err[0]


def test_import_audit_records_the_result_for_info(
    exports: dict[str, Path], source, tmp_path: Path, capsys, tiny_store: Path
):
    """``import --audit N`` audits as the import finishes and keeps the result: ``info`` says when, against
    which model, and what it found; a dataset of the variant has it, and ``require=`` shows it beside the
    provenance fields an import leaves unknown."""
    folder = subset("eagle", exports["eagle"], tmp_path / "eagle", _shortest(source, 2))
    store = str(tmp_path / "s.zarr")
    assert (
        main_exit(["import", "eagle", str(folder), "--store", store, "--model", MODEL, "--audit", "2", "--json"]) == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert rep["audit"]["verdict_kind"] in ("identical", "within_noise") and rep["audit"]["samples"] == 2
    assert main_exit(["info", store, "--json"]) == 0
    (variant,) = json.loads(capsys.readouterr().out)["variants"]
    (audit,) = variant["audits"]
    assert audit["model"] == MODEL and audit["audited_at"] and audit["defects"] == {}
    assert audit["model_fingerprint"] == variant["provenance"]["recipe"]["model"]["fingerprint"]
    assert main_exit(["info", store]) == 0
    assert f"audited {audit['audited_at']} against {MODEL}" in capsys.readouterr().out
    from hsstore import HiddenStateDataset, ProvenanceMismatch

    assert [a.to_dict() for a in HiddenStateDataset(store).audits] == [audit]
    with pytest.raises(ProvenanceMismatch) as e:
        HiddenStateDataset(store, require=f"{tiny_store}#dtype=bf16")
    assert f"audited {audit['audited_at']} against {MODEL}" in str(e.value) and audit["verdict"] in str(e.value)

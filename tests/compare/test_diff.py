from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import LAYERS, make_samples, make_states, new_variant, provenance, run_cli

from hsstore import Store
from hsstore.storage.writer import UnitWriter


def _diff(*args: str) -> tuple[int, dict]:
    r = run_cli("diff", *args, "--json", "-")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"stderr": r.stderr})


def test_diff_with_itself_is_bit_exact(tiny_store: Path):
    code, rep = _diff(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=bf16")
    assert code == 0
    assert rep["shared_samples"] == 40 and rep["only_a"] == rep["only_b"] == 0
    assert [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    for L in rep["layers"]:
        assert L["rel_l2"] == 0 and L["bit_exact"] == 1.0 and L["cos_min"] == pytest.approx(1.0)
        assert L["ulp_distribution"]["0"] == 1.0
    assert rep["verdict"].startswith("identical")
    assert any("A and B are one variant" in n and "by construction" in n for n in rep["notes"]), rep["notes"]


def test_bf16_vs_fp32_grows_with_depth_and_plots(tiny_store: Path, tmp_path: Path):
    png, js = tmp_path / "d.png", tmp_path / "d.json"
    r = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", "--plot", str(png), "--json", str(js))
    assert r.returncode == 0, r.stderr
    rep = json.loads(js.read_text())
    rel = [L["rel_l2"] for L in rep["layers"]]
    assert [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    assert all(x > 0 for x in rel) and rel == sorted(rel), rel
    assert all(L["bit_exact"] < 1 for L in rep["layers"]) and rep["verdict_kind"] == "no_floor"
    assert "rel_l2" in r.stdout and "verdict" in r.stdout
    assert "environment.dtype: bf16 | fp32" in r.stdout  # the provenance difference, spelled out
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_kernel_pair_against_the_fp32_floor(attn_store: Path, tmp_path: Path):
    """Two bf16 kernels of one recipe judged against the fp32 floor: a verdict, the one provenance field
    that differs between A and B, and the floor's differences too."""
    a, b, c = (
        f"{attn_store}#attention=eager,dtype=bf16",
        f"{attn_store}#attention=sdpa,dtype=bf16",
        f"{attn_store}#dtype=fp32",
    )
    r = run_cli("diff", a, b, "--floor", c, "--json", "-")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["verdict_kind"] == "within_noise" and "within precision noise" in rep["verdict"]
    assert [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    assert all(0 < L["floor_ratio"] < 2 for L in rep["layers"])
    numeric = {d["field"]: d for d in rep["provenance_differences"] if not d["informational"]}
    assert numeric["environment.kernels.attention"] == {
        "field": "environment.kernels.attention",
        "a": "eager",
        "b": "sdpa",
        "c": "sdpa",
        "informational": False,
    }
    assert numeric["environment.dtype"]["c"] == "fp32" and numeric["environment.dtype"]["a"] == "bf16"
    assert rep["a_target"] == a and rep["floor_target"] == c


@pytest.mark.parametrize("spelling", ["{s}#dtype=bf16", "{s}/#dtype=bf16", "{s}/../{name}#{vid}", "{s}#{vid}"])
def test_floor_that_is_a_or_b_is_refused(tiny_store: Path, spelling: str):
    vid = Store.open(tiny_store).select("dtype=bf16")
    floor = spelling.format(s=tiny_store, name=tiny_store.name, vid=vid[:6])
    for a, b in (
        (f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32"),
        (f"{tiny_store}#dtype=fp32", f"{tiny_store}#dtype=bf16"),
    ):
        r = run_cli("diff", a, b, "--floor", floor)
        assert r.returncode == 2, r.stdout
        assert "is A itself" in r.stderr or "is B itself" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_states_of_different_models_are_refused_unless_allowed(tmp_path: Path):
    from hsstore.storage.names import another_model_allowed

    s = Store.create(tmp_path / "m.zarr")
    samples = make_samples([30, 40])
    vids = []
    for name in ("model-a", "model-b"):
        prov = provenance("bf16")
        prov["recipe"]["model"] = {"name": name, "fingerprint": name + "-fp", "path": "/x"}
        with another_model_allowed("test"):  # a store of two models, as --another-model makes
            vid = s.create_variant(prov, LAYERS, 16, "bf16", "zstd", 64)
        UnitWriter(s, vid).write(samples, make_states(samples, 16, "bf16", [0, 1, 2], seed=len(vids)))
        vids.append(vid)
    a, b = f"{tmp_path / 'm.zarr'}#{vids[0]}", f"{tmp_path / 'm.zarr'}#{vids[1]}"
    r = run_cli("diff", a, b)
    assert r.returncode == 2 and "states of different models" in r.stderr and "--allow-different-models" in r.stderr
    ok = run_cli("diff", a, b, "--allow-different-models", "--json", "-")
    assert ok.returncode == 0, ok.stderr
    rep = json.loads(ok.stdout)
    assert rep["verdict"].startswith("A and B are states of DIFFERENT MODELS")
    assert any(d["field"] == "recipe.model.fingerprint" for d in rep["provenance_differences"])


def test_max_rel_bound(tiny_store: Path):
    _, rep = _diff(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32")
    worst = max(L["rel_l2"] for L in rep["layers"])
    assert "no floor given" in rep["verdict"]
    below = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", "--max-rel", str(worst * 0.9))
    above = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", "--max-rel", str(worst * 1.1))
    assert below.returncode == 1 and "exceeds --max-rel" in below.stderr
    assert above.returncode == 0


def test_loss_only_counts_fewer_tokens(tiny_store: Path):
    _, full = _diff(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32")
    r = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", "--loss-only", "--json", "-")
    assert 0 < json.loads(r.stdout)["tokens"] < full["tokens"]


def _store(path: Path, n_samples: int) -> str:
    s = Store.create(path)
    a, b = (
        new_variant(s, dtype="bf16", hidden=256, codec="none"),
        new_variant(s, dtype="fp32", hidden=256, codec="none"),
    )
    for i in range(0, n_samples, 10):
        samples = make_samples([400] * 10, seed=i)
        for vid, dt in ((a, "bf16"), (b, "fp32")):
            UnitWriter(s, vid).write(samples, make_states(samples, 256, dt, [0, 1, 2], seed=i))
    return str(path)


PEAK = """
import resource, sys
from hsstore.compare.diff import DiffRequest, run_diff
run_diff(DiffRequest(a_target=sys.argv[1] + "#dtype=bf16", b_target=sys.argv[1] + "#dtype=fp32"))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.process
def test_diff_memory_does_not_grow_with_store_size(tmp_path: Path):
    small, large = _store(tmp_path / "small.zarr", 10), _store(tmp_path / "large.zarr", 100)

    def peak_kb(store: str) -> int:
        r = subprocess.run([sys.executable, "-c", PEAK, store], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip().splitlines()[-1])

    p_small, p_large = peak_kb(small), peak_kb(large)
    # the large store holds 10x the states (~120 MB more); a diff that held them would grow by that much
    assert p_large < p_small + 40_000, (p_small, p_large)


def test_default_diff_opens_each_target_store_once(tiny_store: Path, monkeypatch: pytest.MonkeyPatch):
    """`hsstore diff A B` (no --align) opened A's store twice: once to ask whether A's capture point is
    unknown, once for the diff. The real Store.open is called; the test only counts the calls."""
    opened: list[str] = []
    real = Store.open.__func__

    def counting(cls, path, *args, **kwargs):
        opened.append(str(path))
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(Store, "open", classmethod(counting))
    code, rep = _diff(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32")
    assert code == 0 and rep["shared_samples"] == 40
    assert len(opened) == 2, opened  # A once, B once


def _approx(x: object) -> object:
    """A report with every float as ``pytest.approx`` (1e-4 relative): counts and words compared exactly."""
    if isinstance(x, dict):
        return {k: _approx(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_approx(v) for v in x]
    return pytest.approx(x, rel=1e-4, abs=1e-12, nan_ok=True) if isinstance(x, float) else x


def test_compiled_loops_are_loaded_only_where_they_pay(attn_store: Path, monkeypatch: pytest.MonkeyPatch):
    """A small bf16-vs-bf16 diff (under ``COMPILED_MIN_VALUES``) takes the torch ops and never loads the C loops, a
    large one (here: the bar lowered to 0) the fused loop, with the same report: the
    same counts, ULP buckets, maxima and verdict, and float statistics to float32 rounding of their sums."""
    from hsstore.compare import diff, kernel

    loaded: list[bool] = []
    real = kernel.compiled_kernel
    monkeypatch.setattr(kernel, "compiled_kernel", lambda: loaded.append(True) or real())
    a, b = f"{attn_store}#attention=eager,dtype=bf16", f"{attn_store}#attention=sdpa,dtype=bf16"
    small = diff.run_diff(diff.DiffRequest(a_target=a, b_target=b)).to_dict()
    assert not loaded and small["layers"][0]["ulp_distribution"]
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", 0)
    large = diff.run_diff(diff.DiffRequest(a_target=a, b_target=b)).to_dict()
    assert loaded
    assert {**large, "seconds": 0} == _approx({**small, "seconds": 0})
    for x, y in zip(small["layers"], large["layers"]):
        assert (x["ulp_distribution"], x["bit_exact"], x["max_abs"]) == (
            y["ulp_distribution"],
            y["bit_exact"],
            y["max_abs"],
        )


def test_the_fused_loop_serves_every_dtype_pair_from_its_size_alone(attn_store: Path, monkeypatch: pytest.MonkeyPatch):
    """The fused loop speeds up every pair (bf16 vs fp32 too, not only ULP buckets), so the bar counts every value
    pair a diff compares, bf16-vs-bf16 pairs twice; and not --threads: a diff takes one path however it is run."""
    from hsstore.compare import diff, kernel
    from hsstore.compare.diff import open_target, shared_keys

    loaded: list[bool] = []
    real = kernel.compiled_kernel
    monkeypatch.setattr(kernel, "compiled_kernel", lambda: loaded.append(True) or real())
    a, b = open_target(f"{attn_store}#attention=sdpa,dtype=bf16"), open_target(f"{attn_store}#dtype=fp32")
    keys, layers = shared_keys(a, b), a.record.all_layers
    pairs = sum(a.refs[k].length for k in keys) * a.record.hidden_size * len(layers)
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", pairs)
    assert diff.use_compiled(a, keys, layers, [False]) and not diff.use_compiled(a, keys[:-1], layers, [False])
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", 2 * pairs)  # ULP buckets too: twice the work
    assert diff.use_compiled(a, keys, layers, [True]) and not diff.use_compiled(a, keys, layers, [False])
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", pairs)
    for threads in (1, 2):
        loaded.clear()
        diff.run_diff(
            diff.DiffRequest(
                a_target=f"{attn_store}#attention=sdpa,dtype=bf16", b_target=f"{attn_store}#dtype=fp32", threads=threads
            )
        )
        assert loaded
    monkeypatch.setattr(diff, "COMPILED_MIN_VALUES", pairs + 1)
    loaded.clear()
    diff.run_diff(
        diff.DiffRequest(a_target=f"{attn_store}#attention=sdpa,dtype=bf16", b_target=f"{attn_store}#dtype=fp32")
    )
    assert not loaded


def test_states_in_flight_stay_within_the_memory_budget_whatever_the_threads(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch
):
    """The diff keeps 256 MB of states in flight per thread: `--threads 1000` asked for 256 GB. The states in
    flight are capped by the command's memory budget (HSSTORE_MEMORY_BUDGET, else half the available memory)
    as well, so a thread count can never ask for more memory than the machine has."""
    import threading
    import time

    from hsstore.compare.diff import _sample_bytes, map_samples

    s = Store.open(tiny_store)
    readers = [s.reader(v) for v in s.variant_ids()[:2]]
    layers = [0, 1]
    keys = [k for k in readers[0].keys if k in readers[1].refs]
    smallest = min(_sample_bytes(readers, readers[0].refs[k].length, [layers, layers]) for k in keys)
    monkeypatch.setenv("HSSTORE_MEMORY_BUDGET", str(2 * smallest - 1))  # room for one sample, never two
    active, most, lock = [0], [0], threading.Lock()

    def slow(key: str, states: list) -> str:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return key

    assert list(map_samples(readers, keys, layers, slow, threads=64)) == keys
    assert most[0] == 1, f"{most[0]} samples in flight with a budget of one"


def _store_with_zeroed_layer(path: Path, zero_in: str, scale: float = 1.0, hidden: int = 64) -> str:
    """bf16 and fp32 variants of the same states (times ``scale``), layer 2 of the ``zero_in`` variant all
    zeros (a broken extractor's output), written without the health check that would refuse it."""
    s = Store.create(path)
    vids = {dt: new_variant(s, dtype=dt, hidden=hidden, codec="none") for dt in ("bf16", "fp32")}
    samples = make_samples([50] * 4, seed=1)
    for dt, vid in vids.items():
        states = make_states(samples, hidden, dt, [0, 1, 2], seed=1)
        states = {i: (t.float() * scale).to(t.dtype) for i, t in states.items()}
        if dt == zero_in:
            states[2] = states[2] * 0
        UnitWriter(s, vid, check_health=False).write(samples, states)
    return str(path)


@pytest.mark.parametrize("zero_in", ["fp32", "bf16"])
def test_a_layer_all_zeros_on_one_side_is_never_within_noise(tmp_path: Path, zero_in: str):
    """B (the reference) or A all zeros at one layer where the other side is not: that layer's rel-L2 against B is
    infinite (B zero) or 1 (A zero), never 0, and the verdict against a floor is never within noise: beyond it where
    B is zero; none where A is (A is as far from the floor as from B: the floor measures no rounding there)."""
    from hsstore.compare.diff import DiffRequest, run_diff

    src = _store_with_zeroed_layer(tmp_path / "s.zarr", zero_in)
    floor = _store_with_zeroed_layer(tmp_path / "floor.zarr", "none")
    rep = run_diff(DiffRequest(a_target=f"{src}#dtype=bf16", b_target=f"{src}#dtype=fp32", floor=f"{floor}#dtype=fp32"))
    zeroed, kept = [L for L in rep.layers if L.layer == 2], [L for L in rep.layers if L.layer != 2]
    assert [L.rel_l2 for L in zeroed] == [float("inf") if zero_in == "fp32" else 1.0]
    assert all(0 < L.rel_l2 < 0.01 and "within" in str(L.verdict) for L in kept)  # bf16 rounding of the same states
    if zero_in == "fp32":
        assert "beyond" in str(zeroed[0].verdict) and rep.verdict_kind == "beyond_noise"
    else:
        assert str(zeroed[0].verdict).startswith("no verdict") and rep.verdict_kind == "inconclusive"
        assert rep.verdict.startswith("no verdict: at layer(s) 2 (1)")


def test_diff_json_is_strict_json_where_a_rel_l2_is_infinite(tmp_path: Path):
    """B all zeros at a layer: rel-L2 infinite, which JSON has no number for; ``--json`` stays strict JSON (no
    bare Infinity a JSON parser other than Python's refuses) and names it so that ``float`` reads it back."""
    src = _store_with_zeroed_layer(tmp_path / "s.zarr", "fp32")

    def strict(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    r = run_cli("diff", f"{src}#dtype=bf16", f"{src}#dtype=fp32", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout, parse_constant=strict)
    rel = {L["layer"]: L["rel_l2"] for L in doc["layers"]}
    assert rel[2] == "Infinity" and float(rel[2]) == float("inf")
    assert all(isinstance(rel[i], float) and 0 < rel[i] < 0.01 for i in (0, 1))
    assert {s["rel_l2"] for s in doc["worst_samples"]} == {"Infinity"}


@pytest.mark.parametrize("scale, hidden", [(1e-30, 64), (1e-20, 64), (1.0, 64), (1e18, 512), (1e18, 5120)])
@pytest.mark.parametrize("compiled", [True, False])
def test_rel_l2_and_cosine_hold_at_every_magnitude_a_state_can_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: float, hidden: int, compiled: bool
):
    """bf16 against fp32 of the same states scaled from 1e-30 to 1e18: the squares of a token's values underflow
    float32 at the low end and their sums overflow it at the high end, but a state's magnitude does not change how
    far bf16 rounds it, so rel-L2 and the cosines are those of scale 1, as a float64 computation from the stored
    values gives them, on the compiled loops and on torch's ops alike."""
    import math

    from hsstore.compare import diff
    from hsstore.compare.diff import DiffRequest, run_diff

    monkeypatch.setattr(diff, "use_compiled", lambda *a, **k: compiled)
    src = _store_with_zeroed_layer(tmp_path / "s.zarr", "none", scale=scale, hidden=hidden)
    rep = run_diff(DiffRequest(a_target=f"{src}#dtype=bf16", b_target=f"{src}#dtype=fp32"))
    s = Store.open(src)
    ra, rb = (s.reader(s.select(f"dtype={dt}")) for dt in ("bf16", "fp32"))
    for L in rep.layers:
        x = torch.cat([ra.read_layers(ra.refs[k], [L.layer])[0] for k in ra.keys]).double()
        y = torch.cat([rb.read_layers(rb.refs[k], [L.layer])[0] for k in ra.keys]).double()
        want = math.sqrt(float(((x - y) ** 2).sum() / (y**2).sum()))
        cos = (x * y).sum(1) / (x.norm(dim=1) * y.norm(dim=1))  # (torch's cosine_similarity clamps tiny norms)
        assert 1e-4 < want < 1e-2 and L.rel_l2 == pytest.approx(want, rel=1e-5), (L.layer, L.rel_l2, want)
        assert L.cos_min == pytest.approx(float(cos.min()), abs=1e-9) and L.cos_min < 1.0

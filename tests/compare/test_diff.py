from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import LAYERS, make_samples, make_states, new_variant, provenance, run_cli

from hsstore import Store
from hsstore.core.dtypes import TORCH as TORCH_DTYPES
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


@pytest.mark.parametrize("zero_in", ["B", "A"])
def test_a_layer_all_zeros_on_one_side_is_never_within_noise(tmp_path: Path, zero_in: str):
    """B (the reference) or A all zeros at one layer where the other side is not: that layer's rel-L2 against B is
    infinite (B zero) or 1 (A zero), never 0, and the verdict against A's fp32 floor is never within noise: beyond it
    where B is zero; none where A is (A is as far from the floor as from B: the floor measures no rounding there)."""
    src = _variants(
        tmp_path / "s.zarr",
        {
            "a": ("t", "bf16", _zero_at_2 if zero_in == "A" else _same),
            "b": ("u", "bf16", _zero_at_2 if zero_in == "B" else _same),
            "c": ("t", "fp32", _same),
        },
    )
    _, rep = _diff(f"{src}#backend=t,dtype=bf16", f"{src}#backend=u", "--floor", f"{src}#backend=t,dtype=fp32")
    zeroed, kept = [L for L in rep["layers"] if L["layer"] == 2], [L for L in rep["layers"] if L["layer"] != 2]
    assert [L["rel_l2"] for L in zeroed] == ["Infinity" if zero_in == "B" else 1.0]
    assert all(L["verdict"].startswith("identical") for L in kept)  # the same states, the same dtype
    if zero_in == "B":
        assert "beyond" in zeroed[0]["verdict"] and rep["verdict_kind"] == "beyond_noise"
    else:
        assert zeroed[0]["verdict"].startswith("no verdict") and rep["verdict_kind"] == "inconclusive"
        assert rep["verdict"].startswith("no verdict: at layer 2 A is rel-L2 1 from the floor"), rep["verdict"]


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


def _variants(path: Path, specs: dict[str, tuple[str, str, Any]], masks_empty: bool = False) -> str:
    """A store of one variant per ``specs`` entry, name -> (backend, dtype, f), holding ``f(layer, x)`` of one set of
    fp32 states ``x`` (4 samples, hidden 64, layers 0-2) in the dtype (loss masks all zero with ``masks_empty``)."""
    from hsstore.core.keys import SampleTokens, sample_key

    s = Store.create(path)
    samples = make_samples([50] * 4, seed=1)
    if masks_empty:
        samples = [
            SampleTokens(sample_key("tok", t.input_ids, 0 * t.loss_mask), t.input_ids, 0 * t.loss_mask) for t in samples
        ]
    x = make_states(samples, 64, "fp32", [0, 1, 2], seed=1)
    for backend, dtype, f in specs.values():
        vid = new_variant(s, dtype=dtype, hidden=64, codec="none", backend=backend)
        states = {i: f(i, t.clone()).to(TORCH_DTYPES[dtype]) for i, t in x.items()}
        UnitWriter(s, vid, check_health=False).write(samples, states)
    return str(path)


def _same(layer: int, t: torch.Tensor) -> torch.Tensor:
    return t


def _zero_at_2(layer: int, t: torch.Tensor) -> torch.Tensor:
    return t * 0 if layer == 2 else t


def _inf_in_layer_1(layer: int, t: torch.Tensor) -> torch.Tensor:
    if layer == 1:
        t[3, 5] = float("inf")
    return t


def _off_by(fraction: float) -> Any:
    def f(layer: int, t: torch.Tensor) -> torch.Tensor:
        return t * (1 + fraction * torch.randn(t.shape, generator=torch.Generator().manual_seed(layer)))

    return f


def test_a_non_finite_layer_is_never_within_noise_and_fails_max_rel(tmp_path: Path):
    """An infinite value in B's layer 1 (a kernel that overflowed, kept with --allow-unhealthy) makes that layer's
    rel-L2 NaN: the layer gets no verdict and the diff's verdict is inconclusive (the worst-ratio search skipped the
    NaN and said 'within noise'); --max-rel fails (NaN exceeds every bound)."""
    src = _variants(
        tmp_path / "s.zarr", {"a": ("a", "bf16", _same), "b": ("b", "bf16", _inf_in_layer_1), "c": ("a", "fp32", _same)}
    )
    a, b, c = f"{src}#backend=a,dtype=bf16", f"{src}#backend=b", f"{src}#backend=a,dtype=fp32"
    code, rep = _diff(a, b, "--floor", c, "--max-rel", "0.5")
    layer1 = next(L for L in rep["layers"] if L["layer"] == 1)
    assert rep["verdict_kind"] == "inconclusive" and layer1["verdict"].startswith("no verdict"), rep["verdict"]
    assert "at layer 1 rel-L2 is NaN" in rep["verdict"] and code == 1


def test_a_diff_of_no_tokens_is_refused(tmp_path: Path):
    """--loss-only where every shared sample's loss mask is empty compares nothing: a verdict of 'within noise' over 0
    tokens was printed and --max-rel passed; it is refused (exit 2), naming why."""
    src = _variants(
        tmp_path / "s.zarr", {"a": ("a", "bf16", _off_by(0.3)), "b": ("b", "fp32", _same)}, masks_empty=True
    )
    r = run_cli("diff", f"{src}#backend=a", f"{src}#backend=b", "--loss-only", "--max-rel", "0.001")
    assert r.returncode == 2 and "no token" in r.stderr and "--loss-only" in r.stderr, r.stderr


def test_the_noise_scale_is_the_coarser_dtype_of_a_and_b(tmp_path: Path):
    """fp32 A against bf16 B of the same states differ by bf16's rounding: without a floor the rel-L2 is scaled by
    bf16's unit roundoff (about 0.6x), not fp32's (~1e5x); with an fp32 floor and A the finer side, the floor (A's
    rounding) understates the pair's noise, so a 'beyond noise' reading is no verdict, naming the swap that gives
    one; with A the coarser side the verdict is within noise."""
    src = _variants(
        tmp_path / "s.zarr", {"f16": ("t", "fp16", _same), "b16": ("t", "bf16", _same), "f32": ("t", "fp32", _same)}
    )
    f16, b16, f32 = (f"{src}#dtype={d}" for d in ("fp16", "bf16", "fp32"))
    _, rep = _diff(f32, b16)
    assert all(0.1 < L["roundoff_ratio"] < 2 for L in rep["layers"]), rep["layers"]
    _, rep = _diff(f16, b16, "--floor", f32)
    assert rep["verdict_kind"] == "inconclusive" and "coarser" in rep["verdict"], rep["verdict"]
    _, rep = _diff(b16, f16, "--floor", f32)
    assert rep["verdict_kind"] == "within_noise", rep["verdict"]


def test_a_floor_of_another_computation_than_a_gives_no_verdict(tmp_path: Path):
    """A (kernel 'new', bf16) is 30% off B (kernel 'ref', bf16); the floor given is B's kernel in fp32, so A is as far
    from the floor as from B and the ratio read 1.00x, 'within noise'. A floor that is not A's computation (another
    backend or kernels) measures more than A's rounding: no verdict, naming the field; A's own fp32 gives one."""
    src = _variants(
        tmp_path / "s.zarr",
        {
            "a": ("new", "bf16", _off_by(0.3)),
            "a32": ("new", "fp32", _off_by(0.3)),
            "b": ("ref", "bf16", _same),
            "c": ("ref", "fp32", _same),
        },
    )
    a, b = f"{src}#backend=new,dtype=bf16", f"{src}#backend=ref,dtype=bf16"
    _, rep = _diff(a, b, "--floor", f"{src}#backend=ref,dtype=fp32")
    assert rep["verdict_kind"] == "inconclusive" and "environment.backend" in rep["verdict"], rep["verdict"]
    _, rep = _diff(a, b, "--floor", f"{src}#backend=new,dtype=fp32")
    assert rep["verdict_kind"] == "beyond_noise", rep["verdict"]


def test_a_floor_that_is_a_copy_of_b_is_refused(tmp_path: Path):
    """The floor refused when it is A or B by path is let through as a copy of B's store: the same variant id is the
    same computation, which measures no precision, wherever it lies."""
    import shutil

    src = _variants(tmp_path / "s.zarr", {"a": ("a", "bf16", _same), "b": ("b", "fp32", _same)})
    shutil.copytree(src, tmp_path / "copy.zarr")
    r = run_cli("diff", f"{src}#backend=a", f"{src}#backend=b", "--floor", f"{tmp_path / 'copy.zarr'}#backend=b")
    assert r.returncode == 2 and "same computation as B" in r.stderr, r.stderr


def test_identical_non_finite_values_are_named(tmp_path: Path):
    """A and B bit-identical, both with an infinity at layer 1: 'identical' is true, and the report says that layer
    holds non-finite values."""
    src = _variants(tmp_path / "s.zarr", {"a": ("a", "bf16", _inf_in_layer_1), "b": ("b", "bf16", _inf_in_layer_1)})
    _, rep = _diff(f"{src}#backend=a", f"{src}#backend=b")
    assert rep["verdict_kind"] == "identical"
    assert any("layer 1" in n and "NaN or infinite" in n for n in rep["notes"]), rep["notes"]


def test_a_floor_over_other_samples_is_named_and_a_repeated_layer_counts_once(tmp_path: Path):
    """The floor shares 1 of the 4 samples A and B share: its rel-L2 is over that sample, and the report (text and
    JSON) says so. ``--layers 1 --layers 1`` reports layer 1 once."""
    src = _variants(tmp_path / "s.zarr", {"a": ("t", "bf16", _same), "b": ("u", "fp32", _same)})
    s = Store.open(src)
    floor = Store.create(tmp_path / "floor.zarr")
    samples = make_samples([50] * 4, seed=1)[:1]
    vid = new_variant(floor, dtype="fp32", hidden=64, codec="none", backend="t")
    x = make_states(make_samples([50] * 4, seed=1), 64, "fp32", [0, 1, 2], seed=1)
    UnitWriter(floor, vid, check_health=False).write(samples, {i: t[:50] for i, t in x.items()})
    assert len(s.reader(s.select("backend=t")).keys) == 4
    args = (f"{src}#backend=t", f"{src}#backend=u", "--floor", f"{tmp_path / 'floor.zarr'}#{vid}")
    r = run_cli("diff", *args, "--layers", "1", "--layers", "1")
    assert r.returncode == 0, r.stderr
    assert "note: the floor C is measured over the 1 samples A and C share, 1 of the 4 A and B share" in r.stdout
    _, rep = _diff(*args, "--layers", "1", "--layers", "1")
    assert [L["layer"] for L in rep["layers"]] == [1] and any("the floor C is measured over" in n for n in rep["notes"])


def test_a_sampled_verdict_of_agreement_says_what_its_sample_cannot_see(tmp_path: Path):
    """Samples that differ are 1 in 4 of 40; 3 sampled of 40 can all miss them and read 'identical': the verdict then
    names the share of samples a divergence could hide in at that sample size (the 0-of-n upper bound), so a user
    reads that 3 samples rule out nothing under ~63%. A full diff sees them."""
    from hsstore.compare.sampling import upper_bound

    s = Store.create(tmp_path / "s.zarr")
    samples = make_samples([30] * 40, seed=2)
    x = make_states(samples, 64, "bf16", [0, 1, 2], seed=2)
    for backend, off in (("a", True), ("b", False)):
        vid = new_variant(s, dtype="bf16", hidden=64, codec="none", backend=backend)
        states = {i: t.clone() for i, t in x.items()}
        for k in range(0, 40, 4) if off else ():
            for t in states.values():
                t[30 * k : 30 * k + 30] *= 1.5
        UnitWriter(s, vid, check_health=False).write(samples, states)
    a, b = f"{tmp_path / 's.zarr'}#backend=a", f"{tmp_path / 's.zarr'}#backend=b"
    _, full = _diff(a, b)
    assert all(L["bit_exact"] < 1 for L in full["layers"])
    seen = []
    for seed in range(8):
        _, rep = _diff(a, b, "--samples", "3", "--seed", str(seed))
        if rep["verdict_kind"] == "identical":
            share = f"under {upper_bound(0, 3, 0.95):.0%} of the 40 samples goes unseen by 3 sampled"
            assert share in rep["verdict"], rep["verdict"]
            seen.append(seed)
    assert seen, "no seed missed the differing samples: the case this test is about did not occur"

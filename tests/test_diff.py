from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hsstore.storage.writer import UnitWriter
from hsstore import Store

from helpers import make_samples, make_states, new_variant, run_cli


def _diff(*args: str) -> tuple[int, dict]:
    r = run_cli("diff", *args, "--json", "-")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"stderr": r.stderr})


def test_diff_with_itself_is_bit_exact(tiny_store: Path):
    code, rep = _diff(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=bf16")
    assert code == 0
    assert rep["shared_samples"] == 40 and rep["only_a"] == rep["only_b"] == 0
    for L in rep["layers"]:
        assert L["rel_l2"] == 0 and L["bit_exact"] == 1.0 and L["cos_min"] == pytest.approx(1.0)
        assert L["ulp_distribution"]["0"] == 1.0
    assert rep["verdict"].startswith("identical")


def test_bf16_vs_fp32_grows_with_depth_and_plots(tiny_store: Path, tmp_path: Path):
    png, js = tmp_path / "d.png", tmp_path / "d.json"
    r = run_cli("diff", f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", "--floor", f"{tiny_store}#dtype=fp32",
                "--plot", str(png), "--json", str(js))
    assert r.returncode == 0, r.stderr
    rep = json.loads(js.read_text())
    rel = [L["rel_l2"] for L in rep["layers"]]
    assert all(x > 0 for x in rel) and rel == sorted(rel), rel
    assert all(L["bit_exact"] < 1 and L["floor_ratio"] == pytest.approx(1.0) for L in rep["layers"])
    assert "within precision noise" in rep["verdict"]
    assert "rel_l2" in r.stdout and "verdict" in r.stdout
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100


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
    a, b = new_variant(s, dtype="bf16", hidden=256, codec="none"), new_variant(s, dtype="fp32", hidden=256, codec="none")
    for i in range(0, n_samples, 10):
        samples = make_samples([400] * 10, seed=i)
        for vid, dt in ((a, "bf16"), (b, "fp32")):
            UnitWriter(s, vid).write(samples, make_states(samples, 256, dt, [0, 1, 2], seed=i))
    return str(path)


PEAK = """
import resource, sys
from hsstore.compare.diff import diff_targets
diff_targets(sys.argv[1] + "#dtype=bf16", sys.argv[1] + "#dtype=fp32")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_diff_memory_does_not_grow_with_store_size(tmp_path: Path):
    small, large = _store(tmp_path / "small.zarr", 10), _store(tmp_path / "large.zarr", 100)

    def peak_kb(store: str) -> int:
        r = subprocess.run([sys.executable, "-c", PEAK, store], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip().splitlines()[-1])

    p_small, p_large = peak_kb(small), peak_kb(large)
    # the large store holds 10x the states (~120 MB more); a diff that held them would grow by that much
    assert p_large < p_small + 40_000, (p_small, p_large)

"""The fast diff (blocked float32 reductions, threads) against a straightforward float64 reference
on real stores: same numbers to float rounding, same counts exactly, whatever the thread count."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hsstore import Store
from hsstore.compare.diff import DiffRequest, open_target, run_diff
from hsstore.compare.kernel import EDGES
from hsstore.storage.writer import UnitWriter

ULP_EDGES = torch.tensor([0, 1, 2, 4, 8, 16], dtype=torch.int64)


def _ordered(x: torch.Tensor) -> torch.Tensor:
    bits = x.contiguous().view(torch.int16).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def reference(a_t: str, b_t: str) -> list[dict]:
    """Per-layer statistics computed the plain way: every value in float64, sample by sample."""
    a, b = open_target(a_t), open_target(b_t)
    layers = a.record.all_layers
    acc = [
        dict(
            n=0,
            t=0,
            abs=0.0,
            mx=0.0,
            dd=0.0,
            bb=0.0,
            cs=0.0,
            cmin=1.0,
            ex=0,
            cos=[],
            ulp=torch.zeros(7, dtype=torch.int64),
        )
        for _ in layers
    ]
    for key in [k for k in a.keys if k in b.refs]:
        for j, (x, y) in enumerate(zip(a.read_layers(a.refs[key], layers), b.read_layers(b.refs[key], layers))):
            r = acc[j]
            if x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16:
                d = (_ordered(x) - _ordered(y)).abs()
                r["ulp"] += torch.bincount(torch.bucketize(d, ULP_EDGES).flatten(), minlength=7)
            r["ex"] += int((x.double() == y.double()).sum())
            x, y = x.double(), y.double()
            d = x - y
            r["n"] += d.numel()
            r["t"] += d.shape[0]
            r["abs"] += float(d.abs().sum())
            r["mx"] = max(r["mx"], float(d.abs().max()))
            r["dd"] += float((d * d).sum())
            r["bb"] += float((y * y).sum())
            na, nb = x.norm(dim=1), y.norm(dim=1)
            cos = torch.where(na * nb > 0, (x * y).sum(1) / (na * nb).clamp_min(1e-300), (na == nb).double()).clamp(
                -1, 1
            )
            r["cs"] += float(cos.sum())
            r["cmin"] = min(r["cmin"], float(cos.min()))
            r["cos"].append(cos)
    out = []
    for r in acc:
        cos = torch.cat(r["cos"])
        hist = torch.bincount(torch.bucketize(1.0 - cos, EDGES), minlength=len(EDGES) + 1)
        idx = int(torch.searchsorted(torch.cumsum(hist, 0), torch.tensor(math.ceil(0.99 * r["t"]))))
        out.append(
            {
                "mean_abs": r["abs"] / r["n"],
                "max_abs": r["mx"],
                "rel_l2": math.sqrt(r["dd"] / r["bb"]),
                "cos_mean": r["cs"] / r["t"],
                "cos_min": r["cmin"],
                "bit_exact": r["ex"] / r["n"],
                "cos_p01_bin": idx,
                "ulp": (r["ulp"].double() / r["ulp"].sum()).tolist() if r["ulp"].sum() else None,
            }
        )
    return out


def _check(a_t: str, b_t: str, threads: int) -> None:
    ref = reference(a_t, b_t)
    rep = run_diff(DiffRequest(a_target=a_t, b_target=b_t, threads=threads))
    assert [L.layer for L in rep.layers] == open_target(a_t).record.all_layers and len(ref) == len(rep.layers) > 0
    for L, R in zip(rep.layers, ref):
        assert L.rel_l2 == pytest.approx(R["rel_l2"], rel=1e-5), (L.layer, L.rel_l2, R["rel_l2"])
        assert L.mean_abs == pytest.approx(R["mean_abs"], rel=1e-5)
        assert L.max_abs == pytest.approx(R["max_abs"], rel=1e-6)
        assert 1 - L.cos_mean == pytest.approx(1 - R["cos_mean"], rel=1e-4, abs=1e-12)
        assert 1 - L.cos_min == pytest.approx(1 - R["cos_min"], rel=1e-4, abs=1e-12)
        assert L.bit_exact == R["bit_exact"]  # counts: exactly
        # the 1st percentile is read from a histogram: the same bin, or a neighbour (rounding at an edge)
        near = {
            1.0 if i <= 0 else 1.0 - float(EDGES[min(i, len(EDGES) - 1)])
            for i in range(R["cos_p01_bin"] - 1, R["cos_p01_bin"] + 2)
        }
        assert L.cos_p01 in near, (L.layer, L.cos_p01, R["cos_p01_bin"])
        if R["ulp"] is not None:
            assert list(L.ulp_distribution.values()) == pytest.approx(R["ulp"], abs=1e-15)


@pytest.mark.parametrize("threads", [1, 3])
def test_matches_float64_reference_bf16_vs_fp32(tiny_store: Path, threads: int):
    _check(f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32", threads)


def test_matches_float64_reference_bf16_vs_bf16_with_ulps(tiny_store: Path, tmp_path: Path):
    """Two bf16 variants of real states that differ by a few ULPs: the model's bf16 states and its fp32
    states rounded to bf16 (with signed zeros, to check +0 == -0)."""
    src = Store.open(tiny_store)
    bf, fp = src.reader(src.select("dtype=bf16")), src.reader(src.select("dtype=fp32"))
    dst = Store.create(tmp_path / "two-bf16.zarr")
    layers = bf.record.all_layers
    prov = bf.record.provenance
    vids = [
        dst.create_variant(
            {**prov, "environment": {**prov["environment"], "backend": name}},
            bf.record.layers,
            bf.record.hidden_size,
            "bf16",
            "zstd",
            64,
        )
        for name in ("x", "y")
    ]
    for key in bf.keys[:12]:
        ids, mask = bf.read_tokens(bf.refs[key])
        from hsstore.core.keys import SampleTokens

        sample = [SampleTokens(key, ids, mask)]
        model = dict(zip(layers, bf.read_layers(bf.refs[key], layers)))
        rounded = {i: t.bfloat16() for i, t in zip(layers, fp.read_layers(fp.refs[key], layers))}
        for t in rounded.values():
            t[0, :3] = torch.tensor([0.0, -0.0, 1e-3])
        for t in model.values():
            t[0, :3] = torch.tensor([-0.0, 0.0, -1e-3])
        UnitWriter(dst, vids[0]).write(sample, model)
        UnitWriter(dst, vids[1]).write(sample, rounded)
    a_t, b_t = f"{tmp_path / 'two-bf16.zarr'}#{vids[0]}", f"{tmp_path / 'two-bf16.zarr'}#{vids[1]}"
    _check(a_t, b_t, threads=2)
    dist = run_diff(DiffRequest(a_target=a_t, b_target=b_t)).layers[0].ulp_distribution
    assert 0 < dist["0"] < 1 and dist["1"] > 0 and dist[">16"] > 0  # every kind of bucket is exercised


def test_results_do_not_depend_on_thread_count(tiny_store: Path):
    a_t, b_t = f"{tiny_store}#dtype=bf16", f"{tiny_store}#dtype=fp32"
    one = run_diff(DiffRequest(a_target=a_t, b_target=b_t, threads=1)).to_dict()
    many = run_diff(DiffRequest(a_target=a_t, b_target=b_t, threads=4)).to_dict()
    one.pop("seconds"), many.pop("seconds")
    assert one == many and [L["layer"] for L in one["layers"]] == [0, 1, 3]
    assert np.isfinite([L["rel_l2"] for L in one["layers"]]).all()

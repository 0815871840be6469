"""FP8 quantization (hsstore.core.quant) and its error statistics (hsstore.core.quant): round-trip
bounds, exactness of dequantization, the fast CPU path against torch, edge values."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hsstore.core import precision_names as precision
from hsstore.core import quant

# e4m3 has 3 mantissa bits: round to nearest is within half a step, 2**-4 of the value, for normal values
HALF_STEP = 2.0**-4


def residual_like(T: int = 64, H: int = 256, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    channel = torch.exp(torch.randn(H, generator=g) * 1.5)  # per-channel scales, like a residual stream
    token = torch.exp(torch.randn(T, 1, generator=g))
    return (torch.randn(T, H, generator=g) * channel * token).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_error_is_within_half_an_e4m3_step_of_each_normal_value(dtype: torch.dtype) -> None:
    x = residual_like(dtype=dtype)
    q = quant.quantize(x)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == x.shape and q.scales.shape == (x.shape[0], 1)
    y = quant.dequantize(q, torch.float32)
    xf = x.float()
    # values whose scaled magnitude is an e4m3 normal (>= 2**-6) are rounded relatively; the rest absolutely
    normal = xf.abs() / q.scales >= 2.0**-6
    rel = ((y - xf).abs() / xf.abs())[normal]
    assert rel.max() <= HALF_STEP
    tiny_err = (y - xf).abs()[~normal] / q.scales.expand_as(xf)[~normal]
    assert tiny_err.numel() == 0 or tiny_err.max() <= 2.0**-10  # half of e4m3's subnormal step
    s = quant.summary(quant.from_error_tensor(quant.error_tensor(xf, y).tolist()))
    assert 0.005 < s.rel_l2 < 0.04 and s.cos_min > 0.999


def test_scales_are_powers_of_two_that_put_the_row_maximum_in_the_top_binade() -> None:
    x = residual_like()
    q = quant.quantize(x)
    mant, _ = torch.frexp(q.scales)
    assert torch.all(mant == 0.5)
    top = x.abs().amax(dim=1, keepdim=True) / q.scales
    assert torch.all((top >= 224) & (top < 448))


def test_dequantized_bf16_is_exact_and_the_cpu_table_path_equals_torch() -> None:
    x = residual_like(T=100, H=96, dtype=torch.bfloat16)
    q = quant.quantize(x)
    fast = quant.dequantize(q, torch.bfloat16)  # the CPU table path
    slow = (q.fp8.float() * q.scales).to(torch.bfloat16)
    assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))
    # exact: the bf16 values equal the fp32 products (no rounding on the way back)
    assert torch.equal(fast.float(), q.fp8.float() * q.scales)


@pytest.mark.parametrize("H,block", [(96, None), (96, 32), (95, None), (9, 3)])
def test_table_path_handles_blocks_and_odd_widths(H: int, block: int | None) -> None:
    x = residual_like(T=37, H=H, seed=3)
    q = quant.quantize(x, block=block)
    assert q.scales.shape == (37, H // (block or H))
    bits = quant.dequantize_bf16_bits(q.codes.numpy(), q.scales.numpy())
    G = q.scales.shape[1]
    want = (q.fp8.float().reshape(37, G, -1) * q.scales[..., None]).reshape(37, H).to(torch.bfloat16)
    assert np.array_equal(bits, want.view(torch.int16).numpy().view(np.uint16))


def test_stacked_layers_dequantize_in_one_call() -> None:
    xs = [residual_like(T=20, H=64, seed=s) for s in range(3)]
    qs = [quant.quantize(x) for x in xs]
    codes = np.stack([q.codes.numpy() for q in qs], axis=1)  # [T, n_layers, H]
    scales = np.stack([q.scales.numpy() for q in qs], axis=1)  # [T, n_layers, 1]
    bits = quant.dequantize_bf16_bits(codes, scales)
    for j, q in enumerate(qs):
        assert np.array_equal(bits[:, j], quant.dequantize(q).view(torch.int16).numpy().view(np.uint16))


def test_zero_rows_and_exact_zeros_stay_zero() -> None:
    x = residual_like(T=4, H=32)
    x[1] = 0.0
    x[2, 5] = 0.0
    q = quant.quantize(x)
    assert q.scales[1, 0] == 1.0
    y = quant.dequantize(q)
    assert torch.all(y[1] == 0) and y[2, 5] == 0


def test_non_finite_values_become_nan_and_do_not_spoil_the_row_scale() -> None:
    x = residual_like(T=3, H=16)
    x[0, 3], x[1, 4], x[1, 5] = float("nan"), float("inf"), -float("inf")
    q = quant.quantize(x)
    y = quant.dequantize(q, torch.float32)
    assert torch.isnan(y[0, 3]) and torch.isnan(y[1, 4]) and torch.isnan(y[1, 5])
    finite = torch.isfinite(x)
    assert torch.isfinite(q.scales).all()
    rel = ((y - x).abs() / x.abs())[finite & (x.abs() / q.scales >= 2.0**-6)]
    assert rel.max() <= HALF_STEP


def test_quantization_is_deterministic_and_the_same_from_bf16_or_its_fp32_copy() -> None:
    x = residual_like(dtype=torch.bfloat16)
    a, b = quant.quantize(x), quant.quantize(x.float())
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)


def test_scales_that_are_not_powers_of_two_are_refused() -> None:
    codes = np.zeros((2, 4), np.uint8)
    with pytest.raises(ValueError, match="powers of two"):
        quant.dequantize_bf16_bits(codes, np.array([[1.0], [0.3]], np.float32))
    with pytest.raises(ValueError, match="powers of two"):
        quant.dequantize_bf16_bits(codes, np.array([[1.0], [0.0]], np.float32))


def test_bad_shapes_and_precisions_are_refused() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        quant.quantize(torch.ones(2, 10), block=3)
    with pytest.raises(ValueError, match=r"\[tokens, hidden\]"):
        quant.quantize(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="fp8-e4m3"):
        precision.parse_precision("fp4")


def test_error_records_add_up_to_the_error_of_the_whole() -> None:
    x = residual_like(T=50, H=64)
    y = quant.dequantize(quant.quantize(x), torch.float32)
    whole = quant.summary(quant.from_error_tensor(quant.error_tensor(x, y).tolist()))
    parts = [
        quant.from_error_tensor(quant.error_tensor(x[a:b], y[a:b]).tolist()) for a, b in [(0, 7), (7, 31), (31, 50)]
    ]
    merged = quant.summary(quant.merge(parts))
    assert merged.tokens == 50
    for k in ("rel_l2", "cos_mean", "cos_min", "max_abs"):
        assert math.isclose(getattr(merged, k), getattr(whole, k), rel_tol=1e-6), k
    direct = float(torch.linalg.vector_norm(y - x) / torch.linalg.vector_norm(x))
    assert math.isclose(whole.rel_l2, direct, rel_tol=1e-5)


def test_error_of_identical_and_of_zero_states() -> None:
    x = residual_like(T=5, H=8)
    same = quant.summary(quant.from_error_tensor(quant.error_tensor(x, x).tolist()))
    assert same.rel_l2 == 0 and same.cos_min == pytest.approx(1.0) and same.max_abs == 0
    z = torch.zeros(3, 8)
    zero = quant.summary(quant.from_error_tensor(quant.error_tensor(z, z).tolist()))
    assert zero.rel_l2 == 0 and zero.cos_mean == 1.0
    empty = quant.from_error_tensor(quant.error_tensor(z[:0], z[:0]).tolist())
    assert empty["tokens"] == 0


def test_dequantizes_into_one_layer_slot_of_a_stacked_buffer() -> None:
    x = residual_like(T=30, H=64, seed=5)
    q = quant.quantize(x)
    out = np.zeros((30, 3, 64), np.uint16)
    quant.dequantize_bf16_bits(q.codes.numpy(), q.scales.numpy(), out=out[:, 1])
    assert np.array_equal(out[:, 1], quant.dequantize(q).view(torch.int16).numpy().view(np.uint16))
    assert not out[:, 0].any() and not out[:, 2].any()


def _torch_bits(codes: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """The reference: torch's own float8 -> float64 conversion times 2**k, rounded once to bf16."""
    vals = torch.from_numpy(codes).view(quant.FP8).double() * torch.from_numpy(2.0 ** ks.astype(np.float64))[:, None]
    return vals.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("compiled", [True, False])
def test_every_code_at_every_exponent_dequantizes_to_torchs_bits(compiled: bool) -> None:
    # all 256 codes (zeros, subnormals, NaN, both signs) in every row; one row per exponent from far below
    # the compiled loop's range to far above it, where results are bf16 subnormals, zeros or infinities
    ks = np.arange(quant.K_MIN - 20, 128, dtype=np.int32)  # up to float32's largest power of two
    codes = np.tile(np.arange(256, dtype=np.uint8), (len(ks), 1))
    scales = np.ldexp(np.ones((len(ks), 1), np.float64), ks[:, None]).astype(np.float32)
    assert np.array_equal(quant.scale_exponents(scales).ravel(), ks)  # every scale is representable
    got = quant.dequantize_bf16_bits(codes, scales, compiled=compiled)
    want = _torch_bits(codes, ks)
    nan = np.isnan(torch.from_numpy(want.view(np.int16)).view(torch.bfloat16).float().numpy())
    assert nan.sum() == 2 * len(ks)  # the two NaN codes; any NaN pattern is a NaN
    assert np.isnan(torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).float().numpy()[nan]).all()
    assert np.array_equal(got[~nan], want[~nan])


def test_the_compiled_loop_and_the_table_path_agree_on_model_like_states_in_every_layout() -> None:
    x = residual_like(T=257, H=96, seed=11)  # exponents spread over ~20 values, an odd row count
    for block in (None, 32, 3):
        q = quant.quantize(x, block=block)
        c, s = q.codes.numpy(), q.scales.numpy()
        fast, table = quant.dequantize_bf16_bits(c, s), quant.dequantize_bf16_bits(c, s, compiled=False)
        assert len(np.unique(quant.scale_exponents(s))) > 5
        assert np.array_equal(fast, table)
    q = quant.quantize(x)
    out = np.zeros((257, 2, 96), np.uint16)  # a strided destination: one layer of a stacked buffer
    quant.dequantize_bf16_bits(q.codes.numpy(), q.scales.numpy(), out=out[:, 1])
    assert np.array_equal(out[:, 1], quant.dequantize_bf16_bits(q.codes.numpy(), q.scales.numpy(), compiled=False))
    assert not out[:, 0].any()


def test_one_row_out_of_the_compiled_range_sends_the_call_to_the_exact_table_path() -> None:
    codes = np.tile(np.arange(256, dtype=np.uint8), (3, 1))
    ks = np.array([0, quant.K_MIN - 1, 5], np.int32)  # row 1's results underflow into bf16 subnormals
    scales = np.ldexp(np.ones((3, 1), np.float64), ks[:, None]).astype(np.float32)
    got = quant.dequantize_bf16_bits(codes, scales)
    want = _torch_bits(codes, ks)
    finite = ~np.isnan(torch.from_numpy(want.view(np.int16)).view(torch.bfloat16).float().numpy())
    assert np.array_equal(got[finite], want[finite])


@pytest.mark.process
def test_without_numba_the_table_path_serves_with_one_warning(tmp_path) -> None:
    # a real interpreter where ``import numba`` fails (as it does when numba does not support the numpy)
    code = (
        "import sys, warnings; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "from hsstore.core import quant\n"
        "c = np.tile(np.arange(256, dtype=np.uint8), (4, 1)); s = np.ones((4, 1), np.float32) * 8\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    a = quant.dequantize_bf16_bits(c, s); b = quant.dequantize_bf16_bits(c, s)\n"
        "assert (a == quant.dequantize_bf16_bits(c, s, compiled=False)).all() and (a == b).all()\n"
        "print(len(w), w[0].message)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("1 ") and "numba cannot be imported" in r.stdout and "pip install -U numba" in r.stdout

"""The diff kernel's two CPU paths, torch ops and the compiled fused pass, give the same counts, maxima and ULP
buckets to the bit, and per-token float sums (float64) within float32 rounding of a float64 reference (the fused
pass adds float32 blocks of 8 terms a lane in float64, torch in float32; both add rows whose sums leave float32's
range with float64 products), at every magnitude a float32 can hold: a diff may take either
(``hsstore.compare.diff.use_compiled``) without changing a count or what a sum says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hsstore.compare.kernel import (
    ULP_CLAMP,
    TokenSums,
    Workspace,
    _ulp_counts_int16,
    summarize,
    token_sums,
    ulp_distance_clamped,
)

FIELDS = ("sum_abs", "max_abs", "differing", "dd", "aa", "bb", "ad", "ulp")


def _every_bf16() -> torch.Tensor:
    """All 65,536 bf16 bit patterns (NaNs, infinities, -0, subnormals), as ``[256, 256]``."""
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(256, 256)


def _both(a: list[torch.Tensor], b: list[torch.Tensor], ulps: bool) -> tuple[TokenSums, TokenSums, dict[str, tuple]]:
    compiled = token_sums(a, b, Workspace("cpu", compiled=True), ulps)
    return compiled, token_sums(a, b, Workspace("cpu", compiled=False), ulps), _reference(a, b)


def _reference(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, tuple]:
    """Each float sum ``[L, T]`` in float64 from d = a - b rounded to float32 (as both paths form it), with the
    sum of its terms' magnitudes (the scale its rounding error is relative to)."""
    x = torch.stack([t.double() for t in a])
    y = torch.stack([t.double() for t in b])
    d = (torch.stack([t.float() for t in a]) - torch.stack([t.float() for t in b])).double()
    terms = {"sum_abs": d.abs(), "dd": d * d, "aa": x * x, "bb": y * y, "ad": x * d}
    return {name: (t.sum(-1), t.abs().sum(-1)) for name, t in terms.items()}


def _assert_same(x: TokenSums, y: TokenSums, ref: dict[str, tuple], torch_rtol: float = 1e-5) -> None:
    """Counts, maxima and ULP buckets of the fused pass (``x``) equal the torch ops' (``y``); each float sum (float64)
    of the fused pass within 1e-6 of its terms' magnitudes of the float64 sum, the torch ops' within ``torch_rtol``
    (pairwise float32 sums: tests/compare/test_diff_reference.py), both non-finite exactly where that is."""
    for name in FIELDS:
        u, v = getattr(x, name), getattr(y, name)
        if u is None or v is None:
            assert u is v, name
            continue
        if name not in ref:
            torch.testing.assert_close(u, v, rtol=0, atol=0, equal_nan=True, msg=name)
            continue
        want, scale = ref[name]
        finite = torch.isfinite(want)
        for got, rtol in ((u, 1e-6), (v, torch_rtol)):
            assert got.dtype == torch.float64 and torch.equal(torch.isfinite(got), finite), name
            torch.testing.assert_close(got[~finite], want[~finite], rtol=0, atol=0, equal_nan=True, msg=name)
            assert bool(((got - want).abs() <= rtol * scale)[finite].all()), name


@pytest.mark.parametrize("rows", [256, 4096, 1310])  # rows of 256, 16 and 50 values: whole vectors, and tails
def test_ulp_buckets_agree_on_every_bf16_pattern(rows: int) -> None:
    """Against a shuffle, its own negation (opposite-sign NaNs: the torch path's int16 difference wrapped
    into a small distance), and neighbours a few patterns away."""
    a = _every_bf16().flatten()[: rows * (65536 // rows)].view(rows, -1)
    bits = a.view(torch.int16).to(torch.int32)
    g = torch.Generator().manual_seed(0)
    shuffled = a.flatten()[torch.randperm(a.numel(), generator=g)].view(a.shape)
    negated = (-a.float()).bfloat16()
    near = (bits + torch.randint(-20, 21, bits.shape, generator=g)).to(torch.int16).view(torch.bfloat16)
    _assert_same(*_both([a, a, a], [shuffled, negated, near], ulps=True))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e30])
def test_count_and_max_agree_against_fp32(scale: float) -> None:
    a = _every_bf16()
    g = torch.Generator().manual_seed(1)
    b = a.float() + scale * torch.randn(a.shape, generator=g)
    b[::7] = a[::7].float()  # rows where nothing differs
    b[:, ::5] = torch.tensor([0.0, -0.0, float("inf"), float("nan")]).repeat(52)[: b[:, ::5].shape[1]]
    _assert_same(*_both([a], [b], ulps=False))


def _every_non_nan_bf16() -> torch.Tensor:
    """The 65,282 bf16 bit patterns that are not NaNs (infinities, -0, subnormals included), flat."""
    a = _every_bf16().flatten()
    return a[~torch.isnan(a)]


def _ulp_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """ULP distances in int64 (no wrapping), clamped to ULP_CLAMP."""

    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.view(torch.int16).long()
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs().clamp_max(ULP_CLAMP)


def _non_nan_partners(a: torch.Tensor) -> list[torch.Tensor]:
    """Partners for ``a``'s patterns: a shuffle, the negation (distances up to 65,280: the int16 difference
    wraps), neighbours a few patterns away (wrapping past the extremes), and the extremes themselves."""
    g = torch.Generator().manual_seed(2)
    finite = _every_non_nan_bf16()
    bits = a.view(torch.int16).to(torch.int32)
    near = (bits + torch.randint(-20, 21, bits.shape, generator=g)).to(torch.int16).view(torch.bfloat16)
    near = torch.where(torch.isnan(near), -a, near)
    extremes = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 3.3895e38, -3.3895e38]).bfloat16()
    return [finite[torch.randperm(a.numel(), generator=g)], -a, near] + [e.expand(a.numel()) for e in extremes]


def test_int16_ulp_distances_exact_for_every_non_nan_pattern() -> None:
    """The torch int16 path, per value against int64 distances and in total against the compiled loops."""
    a = _every_non_nan_bf16()
    ws = Workspace("cpu", compiled=False)
    for b in _non_nan_partners(a):
        x, y = a.view(2, -1), b.contiguous().view(2, -1)
        got = ulp_distance_clamped(x, y, ws)
        assert torch.equal(got.long().flatten(), _ulp_reference(a, b))
        want = token_sums([x], [y], Workspace("cpu", compiled=True), ulps=True).ulp
        assert want is not None
        torch.testing.assert_close(_ulp_counts_int16(x, y, ws), want[0], rtol=0, atol=0)
        odd = slice(0, 2 * 32641 - 1)  # an odd count of values: the last one is counted on its own
        torch.testing.assert_close(
            _ulp_counts_int16(a[odd].view(1, -1), b[odd].view(1, -1), ws),
            _ulp_counts_int16(a[odd][:-1].view(1, -1), b[odd][:-1].view(1, -1), ws)
            + _ulp_counts_int16(a[odd][-1:].view(1, -1), b[odd][-1:].view(1, -1), ws),
            rtol=0,
            atol=0,
        )


def test_ulp_paths_agree_without_nans() -> None:
    """Through ``token_sums``: NaN-free blocks take the int16 path, blocks with nothing differing (+-0 only)
    skip it, a block with a NaN takes the float path; the compiled loops give the same numbers."""
    a = _every_non_nan_bf16()[: 255 * 256].view(255, 256)
    g = torch.Generator().manual_seed(3)
    partners = [b[: a.numel()].reshape(a.shape) for b in _non_nan_partners(a.flatten())]
    zeros = torch.zeros(a.shape).bfloat16()
    with_nan = a.clone()
    with_nan[7, 9] = float("nan")
    noisy = (a.float() * (1 + 1e-2 * torch.randn(a.shape, generator=g))).bfloat16()
    _assert_same(*_both([a] * len(partners) + [zeros, a, a], partners + [-zeros, a.clone(), with_nan], ulps=True))
    _assert_same(*_both([a], [noisy], ulps=True))


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_torch_path_sums_on_the_gpu_equal_the_cpu_loops() -> None:
    """``hsstore diff --device cuda`` runs the torch path on the GPU (int16 bincount, the NaN fallback, the
    skip): its counts (ULP buckets, differing values, the max) equal the CPU loops' exactly, and its float
    sums to float32 rounding (a GPU reduction adds in another order). Without a GPU the torch path runs on
    the CPU (the same check as above, through every path at once); on the GPU machine, on CUDA."""
    a = _every_non_nan_bf16()[: 255 * 256].view(255, 256)
    partners = [b[: a.numel()].reshape(a.shape) for b in _non_nan_partners(a.flatten())]
    every = _every_bf16()[:255]  # NaNs and infinities of both signs: the float path (one token count per call)
    with_nan = a.clone()
    with_nan[7, 9] = float("nan")
    xs = [a] * len(partners) + [a, a, every, every]
    ys = partners + [a.clone(), with_nan, (-every.float()).bfloat16(), _every_bf16()[1:]]
    g = torch.Generator().manual_seed(4)
    states = torch.randn((255, 256), generator=g).bfloat16()  # residual-stream-like: float sums comparable
    xs, ys = xs + [states], ys + [(states.float() * (1 + 1e-2 * torch.randn(states.shape, generator=g))).bfloat16()]
    cpu = token_sums(xs, ys, Workspace("cpu", compiled=True), True)
    gpu = token_sums([x.to(DEVICE) for x in xs], [y.to(DEVICE) for y in ys], Workspace(DEVICE, compiled=False), True)
    for name in FIELDS:
        u, v = getattr(cpu, name), getattr(gpu, name).cpu()
        if name in ("ulp", "differing", "max_abs"):  # counts and the max: exact, every block
            torch.testing.assert_close(v, u.to(v.dtype), rtol=0, atol=0, equal_nan=True, msg=name)
        else:  # sums over values from 1e-40 to 3e38 depend on the order of adding: the realistic block only
            torch.testing.assert_close(v[-1], u[-1].to(v.dtype), rtol=1e-5, atol=0, msg=name)


def test_ulp_buckets_of_a_pair_that_is_not_bf16_are_refused() -> None:
    """ULP buckets count steps of bf16's grid: asked of float32 states both paths would give counts that mean
    nothing (the fused loop zeros), so the call is refused."""
    a, b = [torch.randn(4, 8)], [torch.randn(4, 8)]
    for compiled in (True, False):
        with pytest.raises(ValueError, match="ULP buckets count bf16 pairs"):
            token_sums(a, [b[0].bfloat16()], Workspace("cpu", compiled=compiled), ulps=True)
        with pytest.raises(ValueError, match="ULP buckets count bf16 pairs"):
            token_sums(a, b, Workspace("cpu", compiled=compiled), ulps=True)


def _hostile_token_sums(ulps: bool) -> TokenSums:
    """Per-token sums ``[3, T]`` as a diff meets them: of real states (both kernels' paths), and by hand the cases
    one_minus_cos treats apart (two zero vectors, one zero vector, equal vectors, NaN and infinite sums, 1 - cos
    rounding to 0 or beyond 2)."""
    g = torch.Generator().manual_seed(7)
    a = [torch.randn(300, 64, generator=g) * s for s in (1e-3, 1.0, 30.0)]
    b = [x + torch.randn(300, 64, generator=g) * 1e-3 * x.abs().mean() for x in a]
    if ulps:
        a, b = [x.bfloat16() for x in a], [y.bfloat16() for y in b]
    ts = token_sums(a, b, Workspace("cpu", compiled=True), ulps)
    nan, inf = float("nan"), float("inf")
    hand = {  # (dd, aa, bb, ad) per token
        "zero vectors": (0.0, 0.0, 0.0, 0.0),
        "a zero": (4.0, 0.0, 4.0, 0.0),
        "b zero": (4.0, 4.0, 0.0, 4.0),
        "equal": (0.0, 9.0, 9.0, 0.0),
        "nan": (nan, 1.0, 1.0, 0.0),
        "inf": (inf, inf, 1.0, inf),
        "opposite": (16.0, 4.0, 4.0, 8.0),
        "beyond 2": (17.0, 4.0, 4.0, 8.5),
        "tiny": (1e-30, 1.0, 1.0, 5e-31),
    }
    cols = torch.tensor(list(hand.values()), dtype=torch.float32).T  # [4, n]
    for j, name in enumerate(("dd", "aa", "bb", "ad")):
        getattr(ts, name)[0, : cols.shape[1]] = cols[j]
    ts.max_abs[1, 5] = nan
    ts.sum_abs[2, 3] = inf
    return ts


@pytest.mark.parametrize("ulps", [False, True])
def test_the_compiled_summary_gives_torchs_maxima_and_histogram_to_the_bit(ulps: bool) -> None:
    """A diff on the compiled loops also sums up each sample (``summarize``) without torch's ops: its 1 - cos per
    token is the same float64 arithmetic, so on these cases (the degenerate ones, NaN, infinities) the maxima and
    the histogram of 1 - cos (cos_min, cos_p01) are torch's exactly; the sums differ only in the order of adding.
    (On ~0.5% of random tokens torch's vectorized kernels round 1 - cos 1 ULP apart: the next test.)"""
    ts = _hostile_token_sums(ulps)
    for t in (ts, TokenSums(*(None if x is None else x[:, :0] for x in vars(ts).values()))):  # and no tokens
        if ulps and t is not ts:
            t.ulp = ts.ulp
        ws = Workspace("cpu", compiled=True)
        compiled, eager = summarize("k", t, 64, ws), summarize("k", t, 64)
        assert ws.kernel(), "a C compiler builds the loops here: the compiled path must be the one tested"
        assert compiled.maxes.shape == eager.maxes.shape and compiled.hist.dtype == eager.hist.dtype
        torch.testing.assert_close(
            torch.from_numpy(compiled.maxes), torch.from_numpy(eager.maxes), rtol=0, atol=0, equal_nan=True
        )
        assert (compiled.hist == eager.hist).all() and compiled.hist.sum() == eager.hist.sum() == t.dd.numel()
        torch.testing.assert_close(
            torch.from_numpy(compiled.sums), torch.from_numpy(eager.sums), rtol=1e-12, atol=0, equal_nan=True
        )


def test_the_compiled_summary_is_within_one_ulp_of_torchs_on_many_tokens() -> None:
    """20,000 random tokens over five orders of magnitude of divergence: the maxima within 1 ULP of torch's (its
    kernels round some tokens' 1 - cos 1 ULP apart), each histogram moving at most the few tokens that lie within
    1 ULP of a bin edge, every token counted."""
    g = torch.Generator().manual_seed(11)
    L, T = 2, 10_000
    scale = 10 ** -torch.randint(1, 6, (L, T), generator=g).float()
    aa = torch.rand(L, T, generator=g) + 0.5
    dd = aa * scale * torch.rand(L, T, generator=g)
    ad = (dd.sqrt() * aa.sqrt() * (torch.rand(L, T, generator=g) - 0.5)).float()
    bb = aa + dd - 2 * ad
    ts = TokenSums(
        *(t.double() for t in (torch.rand(L, T, generator=g), torch.rand(L, T, generator=g), torch.zeros(L, T))),
        *(t.double() for t in (dd, aa, bb, ad)),
        None,
    )
    ws = Workspace("cpu", compiled=True)
    compiled, eager = summarize("k", ts, 64, ws), summarize("k", ts, 64)
    torch.testing.assert_close(torch.from_numpy(compiled.maxes), torch.from_numpy(eager.maxes), rtol=5e-16, atol=0)
    assert (compiled.hist.sum(1) == eager.hist.sum(1)).all() and compiled.hist.sum() == L * T
    assert abs(compiled.hist - eager.hist).sum() <= 2 * L * T // 1000  # a token moves from one bin to the next
    torch.testing.assert_close(torch.from_numpy(compiled.sums), torch.from_numpy(eager.sums), rtol=1e-12, atol=0)


def test_a_layer_of_no_tokens_gives_empty_sums_on_both_paths() -> None:
    """``diff --loss-only`` of a sample whose loss mask is empty (an import may hold one) compares ``[0, H]`` layers:
    the compiled loops refused the (7, 0) view torch hands them, so the diff exited 1."""
    a, b = [torch.zeros(0, 16, dtype=torch.bfloat16)] * 2, [torch.zeros(0, 16, dtype=torch.bfloat16)] * 2
    for ulps in (True, False):
        compiled, eager, _ = _both(a, b, ulps)
        assert compiled.dd.shape == eager.dd.shape == (2, 0)
        assert compiled.ulp is None or torch.equal(compiled.ulp, eager.ulp)
        ws = Workspace("cpu", compiled=True)
        assert (summarize("k", compiled, 16, ws).sums == summarize("k", eager, 16).sums).all()


def test_an_infinite_value_gives_the_same_cosine_on_both_paths() -> None:
    """The torch ops derived |a|² from |b|², a·d and |d|², NaN for an infinite value where the compiled loops sum
    it: the same data reported another 1 - cos on either path (and diffs of 4M value pairs or more take the loops)."""
    a = [torch.tensor([[float("inf"), 1.0], [1.0, 2.0], [3e19, 1.0]])]
    b = [torch.tensor([[1.0, 1.0], [1.0, 2.5], [1.0, 1.0]])]
    compiled, eager, _ = _both(a, b, False)
    torch.testing.assert_close(compiled.aa, eager.aa, equal_nan=True)
    ws = Workspace("cpu", compiled=True)
    x, y = summarize("k", compiled, 2, ws), summarize("k", eager, 2)
    torch.testing.assert_close(torch.from_numpy(x.maxes), torch.from_numpy(y.maxes), equal_nan=True)
    torch.testing.assert_close(torch.from_numpy(x.sums), torch.from_numpy(y.sums), equal_nan=True)


def test_the_loops_refuse_an_output_they_may_not_write() -> None:
    """A read-only array (a memory map, bytes) handed to a C loop as its output would be written through."""
    from hsstore.compare.kernel import compiled_kernel

    loops = compiled_kernel()
    assert loops, "a C compiler builds the loops here"
    x = np.zeros((3, 8), np.float32)
    out = np.zeros((7, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: float32"):
        loops.fused_rows(x, x, False, out, np.zeros(6, np.int64))
    ulp = np.frombuffer(bytes(48), np.int64)
    with pytest.raises(ValueError, match="ulp: int64 .* writable: False"):
        loops.fused_rows(x, x, False, np.zeros((7, 3), np.float32), ulp)


@pytest.mark.parametrize("hidden", [512, 2048, 5120])
def test_sums_of_residual_rows_at_every_scale_stay_within_float32_rounding(hidden: int) -> None:
    """The loops add a row's squares and products in float32 blocks (8 fused multiply-adds a lane) where its sums lie
    in float32's range, and in float64 products where they do not: rows of residual-stream-like states from 1e-25
    to 1e18 (their squares underflow or overflow float32 at the ends), bf16 vs bf16, bf16 vs fp32 and fp32 vs fp32,
    each float sum within 1e-6 of its terms' magnitudes of the float64 sum, counts and maxima torch's."""
    g = torch.Generator().manual_seed(hidden)
    scales = torch.logspace(-25, 18, 44)
    ref = torch.randn(len(scales), hidden, generator=g) * torch.exp(torch.randn(hidden, generator=g))
    ref = ref * scales[:, None]
    noisy = ref * (1 + 2e-3 * torch.randn(ref.shape, generator=g))
    for a, b in ((noisy.bfloat16(), ref.bfloat16()), (noisy.bfloat16(), ref), (noisy, ref)):
        _assert_same(*_both([a, b], [b, b.clone()], ulps=a.dtype == b.dtype == torch.bfloat16))


def test_ulp_buckets_of_a_layer_longer_than_the_int16_lanes_hold_are_exact() -> None:
    """The compiled loop counts ULP buckets in int16 lanes across rows and adds them to the int64 counts every 16,384
    vectors: a layer of 1.1M value pairs (35,200 vectors of 32), 39 in 40 of them apart (0 to 39 ULPs), so each lane of
    the first bucket passes 32,767 within the layer: the counts are the torch path's exactly (a missed flush wraps
    them)."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(1100, 1024, generator=g).bfloat16()
    shift = torch.randint(0, 40, a.shape, generator=g, dtype=torch.int32)  # ULP steps apart
    b = (a.view(torch.int16).to(torch.int32) + shift).to(torch.int16).view(torch.bfloat16)
    compiled, eager, _ = _both([a], [b], ulps=True)
    assert compiled.ulp is not None and eager.ulp is not None
    assert torch.equal(compiled.ulp, eager.ulp), (compiled.ulp, eager.ulp)
    assert int(compiled.ulp[0, 0]) > 32767 * 32  # the first bucket: past what its int16 lanes hold

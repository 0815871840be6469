"""Per-token divergence sums of one sample's states, computed in cache-sized blocks (torch, any device).

For each token and layer this reduces the hidden dimension to seven float32 numbers: sum |a-b|,
max |a-b|, the count of values that differ, |a-b|², |a|², |b|² and a·(a-b) (|a|² derived from the others). Everything the diff
reports is derived from these per-token sums (``hsstore.compare.divergence``), so the pass over a
sample's ``[T, H]`` values of each layer is a handful of vectorized torch reductions on blocks that stay in cache, with
no float64 copy of the states and no per-value temporaries beyond one block.

Where float32 is exact enough and where float64 is needed:
- bf16 and fp16 values convert to float32 exactly, and a-b of two fp32 values is exact when they
  are close (Sterbenz) and otherwise rounds once; every later float32 step is one sum over the hidden
  dimension (at most a few thousand terms, which torch sums pairwise: relative error ~1e-7 of the
  sum of the terms' magnitudes). That is far below any divergence worth reporting.
- What float32 cannot do is cancel: ``1 - a·b/(|a||b|)`` for two nearly equal vectors (fp32 vs fp32
  diffs reach 1 - cos ~ 1e-12) and ``|a|² + |b|² - 2a·b``. Neither is ever formed. 1 - cos comes from
  the exact identity ``1 - cos = (|d|² - (|a|-|b|)²) / (2|a||b|)`` with ``|a|-|b| = (2a·d - |d|²) /
  (|a|+|b|)`` (d = a-b), whose terms are all of the size of d: its error is ~1e-7 * (|d|/|a|)², smaller
  than float64's for the direct formula. Those per-token formulas are evaluated in float64 (they cost
  T·L numbers, not T·L·H).
- Sums across tokens and samples are float64 and counts int64 (``divergence``): a diff adds up 1e9+
  values, which float32 would round to ~1e-4 and counts it would stop at 2^24.
On a CPU (where numba imports; a core dependency, as for ``hsstore.core.fp8_cpu``) a large diff takes one
compiled pass a row (``_fused_rows``) instead of the torch ops (~11 passes a block, 9 more for bf16 ULP buckets):
bf16 widened in the loop, d = a - b in float32 as torch's sub gives it, the five sums in float64 accumulators
rounded to float32 once, count and max |d| from d's bit patterns, and the ULP buckets from the bits. Counts, the
max and the ULP buckets are the torch ops' exactly (for every bit pattern); the float sums are more accurate than
torch's float32 ones, so the two paths agree to float32 rounding of those sums, not to the bit. A sample's sums
then reduce per layer on a compiled loop too (``_summary_rows``, no torch op per sample: 1 - cos is torch's formula in
IEEE float64, which ~0.5% of tokens round 1 ULP apart from torch's kernels, so a maximum may differ by 1 ULP and a
token within 1 ULP of a histogram edge may change bins). Loading the loops
costs a process ~0.4 s (~1 s on busy cores), which only a large diff wins back: which path a diff takes depends
on its data alone (``hsstore.compare.diff.use_compiled``), so the same diff always gives the same numbers.
Overflow: squares are float32, so a state above ~1e19 in magnitude would overflow; hidden states are
orders of magnitude below that (build health stats flag anything near it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsstore.core.interrupt import ForkSafeLock
from hsstore.core.jit import JitLoops

# values per block (rows x hidden): on a CPU the block buffers (~1 MiB each) stay in L2/L3 cache; on a
# GPU a block is a whole sample up to this many values (each op is one kernel launch)
BLOCK_VALUES = 1 << 18
GPU_BLOCK_VALUES = 1 << 26
ULP_BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16")
# a value pair in bucket k of ULP_BUCKETS is more than _ULP_STEPS[k-1] ULPs apart, at most _ULP_STEPS[k]
_ULP_STEPS = (0, 1, 2, 4, 8, 16)


@dataclass
class TokenSums:
    """Per-token sums over the hidden dimension, each ``[L, T]`` float32 (``differing``: a count),
    and for two bf16 variants the counts of values more than 0, 1, 2, 4, 8, 16 ULPs apart per layer
    ``[L, 6]`` float64 (exact integers)."""

    sum_abs: torch.Tensor
    max_abs: torch.Tensor
    differing: torch.Tensor
    dd: torch.Tensor
    aa: torch.Tensor
    bb: torch.Tensor
    ad: torch.Tensor
    ulp: torch.Tensor | None


def bf16_ordered(bits: torch.Tensor, out: torch.Tensor | None = None,
                 scratch: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 bit patterns (int16) as int16 whose differences count ULPs: sign-magnitude to two's
    complement, +0 and -0 both 0 (``(x ^ (s & 0x7FFF)) - s`` with s = x >> 15, in [-32767, 32767])."""
    out = torch.empty_like(bits) if out is None else out
    s = torch.bitwise_right_shift(bits, 15, out=scratch)
    torch.bitwise_and(s, 0x7FFF, out=out)
    torch.bitwise_xor(bits, out, out=out)
    return out.sub_(s)


def _ulp_counts(a: torch.Tensor, b: torch.Tensor, ws: Workspace, sums: torch.Tensor) -> torch.Tensor:
    """``[6]`` counts (float64) of value pairs more than 0, 1, 2, 4, 8 and 16 ULPs apart, of two bf16 blocks
    ``[r, H]`` whose per-row sums ``_block`` wrote into ``sums [7, r]``: where a row's sum |d| is NaN (a NaN value,
    or infinities of one sign facing each other), the float path; else (no NaN: torch's int16 path is exact)
    nothing for a block without a differing value, or that path."""
    if bool(torch.isnan(sums[0]).any()):
        return _ulp_counts_float(a, b, ws)
    if not bool(sums[2].any()):  # no NaN and no pair differs: every pair is equal (or +-0), 0 ULPs apart
        return torch.zeros(len(_ULP_STEPS), dtype=torch.float64, device=a.device)
    return _ulp_counts_int16(a, b, ws)


ULP_CLAMP = 17  # distances above 16 ULPs share one bucket: the int16 path clamps to this


def ulp_distance_clamped(a: torch.Tensor, b: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """ULP distances of two bf16 blocks ``[r, H]``, clamped to ULP_CLAMP, as uint8 ``[r, H]`` (a Workspace
    buffer); exact where neither value of a pair is a NaN. From the bits x (int16) and magnitudes m: the
    distance is |xa - xb| for two values of one sign, ma + mb for opposite signs. With f = -1 where the signs
    differ (else 0), xb' = (xb ^ f) + 32767·f is xb or -xb - 2^15, so xa - xb' is xa - xb or ma + mb modulo
    2^16. Only ma + mb >= 2^15 wraps, to at least 2^16 - 2·0x7F80 = 256 (infinity is 0x7F80; only NaNs lie
    beyond), which the clamp takes to ULP_CLAMP as it should."""
    r, H = a.shape
    xa, xb = a.view(torch.int16), b.view(torch.int16)
    flip, distance = ws.buf("u0", r, H, torch.int16), ws.buf("u1", r, H, torch.int16)
    torch.bitwise_xor(xa, xb, out=flip).bitwise_right_shift_(15)
    torch.bitwise_xor(xb, flip, out=distance).add_(flip, alpha=32767)
    torch.sub(xa, distance, out=distance).clamp_(-ULP_CLAMP, ULP_CLAMP).abs_()
    return ws.buf("u8", r, H, torch.uint8).copy_(distance)


def _ulp_counts_int16(a: torch.Tensor, b: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """``_ulp_counts`` of two NaN-free bf16 blocks: the clamped distances (uint8) read two at a time as int16
    codes ``lo + 256·hi``, one ``bincount`` of those codes (a bincount of single bytes runs 2-3x slower: runs
    of equal values chain its increments), and a fixed matrix folding the code counts into the six counts."""
    flat = ulp_distance_clamped(a, b, ws).view(-1)
    pairs = flat[: flat.numel() // 2 * 2].view(torch.int16)
    codes = torch.bincount(pairs, minlength=_PAIR_CODES)
    if flat.numel() % 2:  # the odd last value: code lo = its distance, hi = 0
        codes[int(flat[-1])] += 1
    return torch.mv(_pair_fold(codes.device), codes.double())


_PAIR_CODES = ULP_CLAMP * 257 + 1  # codes lo + 256·hi with lo, hi <= ULP_CLAMP
_pair_folds: dict[torch.device, torch.Tensor] = {}


def _pair_fold(device: torch.device) -> torch.Tensor:
    """``[6, _PAIR_CODES]`` float64: how many of a code's two distances exceed each of ``_ULP_STEPS``."""
    if device not in _pair_folds:
        code = torch.arange(_PAIR_CODES)
        lo, hi = code % 256, code // 256
        steps = torch.tensor(_ULP_STEPS)[:, None]
        _pair_folds[device] = ((lo > steps).double() + (hi > steps).double()).to(device)
    return _pair_folds[device]


def _ulp_counts_float(a: torch.Tensor, b: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """``_ulp_counts`` for any bit patterns, NaNs too (the distance taken in float32, exact: the ordered ints
    are within +-32767), as float sums: with e = ULP distance - 1 clamped to [-1, 16], the count above t is
    sum(clamp(e, t-1, t)) - (t-1)·n, exact in float32 per row."""
    r, H = a.shape
    i16 = [ws.buf(f"i{k}", r, H, torch.int16) for k in range(2)]
    f, s = ws.buf("e", r, H), ws.buf("s", r, H)
    f.copy_(bf16_ordered(a.view(torch.int16), i16[0], i16[1]))
    f.sub_(bf16_ordered(b.view(torch.int16), i16[0], i16[1])).abs_().sub_(1).clamp_(-1, 16)
    above = torch.empty((len(_ULP_STEPS), r), dtype=torch.float32, device=a.device)
    for k, t in enumerate(_ULP_STEPS):
        torch.sum(torch.clamp(f, t - 1, t, out=s), dim=1, out=above[k])
        above[k] -= (t - 1) * H
    return above.double().sum(1)


class Workspace:
    """Reused block buffers on one device (a fresh temporary per block costs page faults), and whether
    blocks on the CPU use the compiled loops (``compiled``; the torch ops give the same counts, maxima and ULP
    buckets, and sums within float32 rounding: tests/compare/test_kernel.py)."""

    def __init__(self, device: torch.device | str = "cpu", compiled: bool = True) -> None:
        self.device = torch.device(device)
        self.compiled = compiled and self.device.type == "cpu"
        self._bufs: dict[str, torch.Tensor] = {}

    def kernel(self) -> Any:
        """The compiled loops, or False: the torch ops serve."""
        return self.compiled and compiled_kernel()

    def buf(self, name: str, rows: int, hidden: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        t = self._bufs.get(name)
        if t is None or t.shape[0] < rows or t.shape[1] != hidden:
            t = torch.empty((max(rows, 1), hidden), dtype=dtype, device=self.device)
            self._bufs[name] = t
        return t[:rows]


def _as_f32(x: torch.Tensor, ws: Workspace, name: str) -> torch.Tensor:
    if x.dtype == torch.float32:
        return x
    out = ws.buf(name, x.shape[0], x.shape[1])
    out.copy_(x)
    return out


def token_sums(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], ws: Workspace,
               ulps: bool = False) -> TokenSums:
    """Per-token sums of one sample's states: ``a``, ``b`` hold one ``[T, H]`` tensor per layer
    (B is the reference)."""
    L = len(a)
    T, H = a[0].shape
    for x, y in zip(a, b):
        if x.shape != y.shape or x.shape != (T, H):
            raise ValueError(f"states of shape {tuple(x.shape)} and {tuple(y.shape)} cannot be compared")
        if ulps and (x.dtype != torch.bfloat16 or y.dtype != torch.bfloat16):
            raise ValueError(f"ULP buckets count bf16 pairs; these states are {x.dtype} and {y.dtype}")
    out = torch.empty((7, L, T), dtype=torch.float32, device=ws.device)
    ulp = torch.zeros((L, len(_ULP_STEPS)), dtype=torch.float64, device=ws.device) if ulps else None
    kernel = ws.kernel()
    step = max(1, (BLOCK_VALUES if ws.device.type == "cpu" else GPU_BLOCK_VALUES) // H)  # tokens per block
    for j, (x, y) in enumerate(zip(a, b)):
        x, y = x.to(ws.device, non_blocking=True), y.to(ws.device, non_blocking=True)
        if kernel:  # one fused pass a row over the whole layer
            _fused(x, y, out[:, j], None if ulp is None else ulp[j], ws, kernel)
            continue
        for r0 in range(0, T, step):
            _block(x[r0 : r0 + step], y[r0 : r0 + step], out[:, j, r0 : r0 + step], ws)
            if ulp is not None:
                ulp[j] += _ulp_counts(x[r0 : r0 + step], y[r0 : r0 + step], ws, out[:, j, r0 : r0 + step])
    return TokenSums(out[0], out[1], out[2], out[3], out[4], out[5], out[6], ulp)


def _fused_operand(x: torch.Tensor, ws: Workspace, name: str) -> tuple[np.ndarray, bool]:
    """``x [T, H]`` as the compiled loop reads it: bf16 as its bit patterns (int16, widened in the loop), float32
    as it is, any other dtype copied to float32 first; and whether it is bf16."""
    if x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy(), True
    return _as_f32(x.contiguous(), ws, name).numpy(), False


def _fused(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, ulp: torch.Tensor | None, ws: Workspace,
           kernel: Any) -> None:
    """The seven per-row sums of one layer ``[T, H]`` into ``out [7, T]`` (and the ULP counts of two bf16 layers
    into ``ulp [6]``) in one compiled pass a row: float64 accumulators, rounded to float32 once."""
    (xa, a16), (yb, b16) = _fused_operand(x, ws, "a"), _fused_operand(y, ws, "b")
    scratch = ws.buf("fused", 3, x.shape[1]).numpy()
    counts = np.zeros(len(_ULP_STEPS), np.float64)
    kernel("_fused_rows", xa, yb, a16, b16, ulp is not None and a16 and b16, out.numpy(), counts, scratch)
    if ulp is not None:
        ulp += torch.from_numpy(counts)


def _block(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, ws: Workspace) -> None:
    """The seven per-row sums of one block of rows ``[r, H]`` into ``out [7, r]`` (every op writes into
    a reused buffer: a fresh temporary per block would cost page faults)."""
    r, H = a.shape
    af, bf = _as_f32(a, ws, "a"), _as_f32(b, ws, "b")
    d, s = ws.buf("d", r, H), ws.buf("s", r, H)
    torch.sub(af, bf, out=d)
    torch.linalg.vector_norm(d, dim=1, out=out[3])
    torch.linalg.vector_norm(bf, dim=1, out=out[5])
    torch.sum(torch.mul(af, d, out=s), dim=1, out=out[6])
    torch.abs(d, out=s)
    torch.sum(s, dim=1, out=out[0])
    torch.amax(s, dim=1, out=out[1])
    torch.sum(torch.sign(s, out=s), dim=1, out=out[2])  # 1 where a value differs, else 0
    out[3].square_()
    out[5].square_()
    # |a|^2 = |b|^2 + 2 a.d - |d|^2 (exactly 0 for a zero vector a: then d = -b and a.d = 0)
    torch.add(out[5], out[6], alpha=2, out=out[4])
    out[4].sub_(out[3])


def _fused_rows(a: np.ndarray, b: np.ndarray, a16: bool, b16: bool, ulps: bool, out: np.ndarray,
                ulp: np.ndarray, scratch: np.ndarray) -> None:  # pragma: no cover (runs compiled)
    """Per row of ``a``, ``b`` ``[T, H]`` (bf16 bit patterns as int16 where ``a16``/``b16``, else float32): the
    seven sums of ``_block`` into ``out [7, T]`` from one pass over the row (d = a - b in float32, as torch's sub;
    the sums in float64), count and max |d| from d's bit patterns, and where ``ulps`` the ULP counts into ``ulp``.
    ``scratch``: float32 ``[3, H]`` (the row of a, of b, and d)."""
    fa, fb, fd = scratch[0], scratch[1], scratch[2]
    ia, ib = fa.view(np.int32), fb.view(np.int32)
    for r in range(a.shape[0]):
        _widen_row(a[r], a16, fa, ia)
        _widen_row(b[r], b16, fb, ib)
        s_abs = dd = aa = bb = ad = 0.0
        for j in range(fa.shape[0]):
            x, y = fa[j], fb[j]
            d = x - y
            fd[j] = d
            x64, y64, d64 = np.float64(x), np.float64(y), np.float64(d)
            s_abs += abs(d64)
            dd += d64 * d64
            aa += x64 * x64
            bb += y64 * y64
            ad += x64 * d64
        nd, m = _count_max(fd.view(np.int32))
        out[0, r], out[2, r], out[3, r], out[4, r], out[5, r], out[6, r] = s_abs, nd, dd, aa, bb, ad
        out[1, r] = np.array([m], np.int32).view(np.float32)[0]
        if ulps:
            _ulp_row(a[r], b[r], ulp)


def _summary_rows(dd: np.ndarray, aa: np.ndarray, bb: np.ndarray, ad: np.ndarray, sum_abs: np.ndarray,
                  differing: np.ndarray, max_abs: np.ndarray, edges: np.ndarray, sums: np.ndarray, maxes: np.ndarray,
                  hist: np.ndarray) -> None:  # pragma: no cover (runs compiled)
    """One sample's per-layer sums from its per-token sums ``[L, T]`` (float32), as ``divergence.summarize``
    makes them with torch's ops: into ``sums [L, 5]`` the float64 sums of sum |d|, of the differing counts, of
    |d|², of |b|² and of 1 - cos; into ``maxes [L, 2]`` max |d| and max 1 - cos (NaN if any is, as torch's amax);
    into ``hist [L, len(edges) + 1]`` the tokens per bin of 1 - cos (``_bin``). 1 - cos is ``_one_minus_cos``:
    torch's or 1 ULP from it, so the maxima too; the bins too but for a token within 1 ULP of an edge."""
    for layer in range(dd.shape[0]):
        s_abs = s_diff = s_dd = s_bb = s_omc = 0.0
        m_abs = m_omc = 0.0
        for t in range(dd.shape[1]):
            d, b2 = np.float64(dd[layer, t]), np.float64(bb[layer, t])
            v = _one_minus_cos(d, np.float64(aa[layer, t]), b2, np.float64(ad[layer, t]))
            s_abs += np.float64(sum_abs[layer, t])
            s_diff += np.float64(differing[layer, t])
            s_dd += d
            s_bb += b2
            s_omc += v
            m = np.float64(max_abs[layer, t])
            if t == 0 or (m_abs == m_abs and (m > m_abs or m != m)):  # (a NaN stays the max, as torch's amax)
                m_abs = m
            if t == 0 or (m_omc == m_omc and (v > m_omc or v != v)):
                m_omc = v
            hist[layer, _bin(edges, v)] += 1
        sums[layer, 0], sums[layer, 1], sums[layer, 2], sums[layer, 3], sums[layer, 4] = s_abs, s_diff, s_dd, s_bb, s_omc
        maxes[layer, 0], maxes[layer, 1] = m_abs, m_omc


def _one_minus_cos(d: float, a2: float, b2: float, ad: float) -> float:  # pragma: no cover (runs compiled)
    """``divergence.one_minus_cos`` of one token: the same float64 operations in the same order, each rounded as IEEE
    says (compiled without fastmath: no contraction into fused multiply-adds; torch's vectorized kernels round ~0.5%
    of tokens 1 ULP apart), the clamps keeping a NaN as torch's do."""
    na, nb = np.sqrt(a2), np.sqrt(b2)
    norm_sum = na + nb
    if norm_sum < 1e-300:
        norm_sum = 1e-300
    gap = (2.0 * ad - d) / norm_sum
    num = d - gap * gap
    if num < 0.0:
        num = 0.0
    den = 2.0 * na * nb
    v: float
    if den > 0.0:
        v = num / (den if den >= 1e-300 else 1e-300)
    else:
        v = 0.0 if na == nb else 1.0
    if v < 0.0:
        v = 0.0
    elif v > 2.0:
        v = 2.0
    return v


def _bin(edges: np.ndarray, v: float) -> int:  # pragma: no cover (runs compiled)
    """torch.bucketize's bin of ``v``: i with edges[i-1] < v <= edges[i]; a NaN in the last bin."""
    n: int = edges.shape[0]
    if v != v:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if edges[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _widen_row(src: np.ndarray, bf16: bool, f: np.ndarray, bits: np.ndarray) -> None:  # pragma: no cover (runs compiled)
    """One row as float32 into ``f``: bf16 bit patterns (int16, ``bf16``) widened through ``bits`` (``f``'s int32
    view), else each value converted."""
    if bf16:
        for j in range(src.shape[0]):
            bits[j] = np.int32(src[j]) << np.int32(16)
    else:
        for j in range(src.shape[0]):
            f[j] = src[j]


def _count_max(dbits: np.ndarray) -> tuple[np.int32, np.int32]:  # pragma: no cover (runs compiled)
    """(count of nonzero d, max |d|'s bit pattern) from float32 d's bit patterns (int32): |d|'s patterns
    order as integers, with NaN above infinity (a NaN d makes the max NaN, as torch's amax, and is not
    counted, as torch's sign gives it 0); -0 is 0."""
    nd, m = np.int32(0), np.int32(0)
    for j in range(dbits.shape[0]):
        v = dbits[j] & np.int32(0x7FFFFFFF)
        nd += np.int32(min(v, 1)) - np.int32(v > 0x7F800000)  # (torch's sign(NaN) is 0: not counted)
        m = max(m, v)
    return nd, m


def _ulp_row(a: np.ndarray, b: np.ndarray, ulp: np.ndarray) -> None:  # pragma: no cover (runs compiled)
    """Add one row's counts of bf16 pairs more than 0, 1, 2, 4, 8, 16 ULPs apart to ``ulp``: bits
    (int16) to ordered ints as ``bf16_ordered``, e = distance - 1 clamped to [-1, 16], and the count
    above t is the sum of clamp(e - t + 1, 0, 1) (int32 lanes: vectorized)."""
    one, zero = np.int32(1), np.int32(0)
    c0 = c1 = c2 = c3 = c4 = c5 = zero
    for j in range(a.shape[0]):
        va, vb = np.int32(a[j]), np.int32(b[j])
        sa, sb = va >> np.int32(15), vb >> np.int32(15)
        e = ((va ^ (sa & np.int32(0x7FFF))) - sa) - ((vb ^ (sb & np.int32(0x7FFF))) - sb)
        e = min(max(max(e, -e) - one, -one), np.int32(16))
        c0 += min(max(e + one, zero), one)
        c1 += min(max(e, zero), one)
        c2 += min(max(e - one, zero), one)
        c3 += min(max(e - np.int32(3), zero), one)
        c4 += min(max(e - np.int32(7), zero), one)
        c5 += min(max(e - np.int32(15), zero), one)
    ulp[0] += c0
    ulp[1] += c1
    ulp[2] += c2
    ulp[3] += c3
    ulp[4] += c4
    ulp[5] += c5


_kernel: Any = None
_kernel_lock = ForkSafeLock()


def compiled_kernel() -> Any:
    """``_fused_rows`` compiled on first use (cached on disk where numba can write, as
    ``hsstore.core.fp8_cpu``); False where numba cannot be imported (the torch block path serves)."""
    global _kernel
    with _kernel_lock:  # worker threads ask together on their first sample
        if _kernel is None:
            try:
                import numba
            except ImportError:
                _kernel = False
                return _kernel
            _kernel = JitLoops(lambda cache: _compile(numba, cache))
    return _kernel


def warm_kernel(pairs: Sequence[tuple[bool, bool, bool]], layers: int) -> None:
    """Load the compiled loops and, for each pair (A is bf16, B is bf16, ULP buckets too) of ``layers`` layers,
    the machine code of its calls: ``token_sums`` and the summary (``divergence.summarize``) on two tokens of zeros (a signature's first call loads it from
    numba's disk cache, or compiles it). Errors are left to the real first call, which reports them."""
    dtype = {True: torch.bfloat16, False: torch.float32}
    ws = Workspace("cpu", compiled=True)
    try:
        for a16, b16, ulps in dict.fromkeys(pairs):
            token_sums([torch.zeros(2, 1, dtype=dtype[a16])] * layers, [torch.zeros(2, 1, dtype=dtype[b16])] * layers,
                       ws, ulps)
        per_token = [np.zeros((layers, 2), np.float32) for _ in range(7)]  # as divergence.summarize passes them
        compiled_kernel()("_summary_rows", *per_token, np.ones(3), np.zeros((layers, 5)), np.zeros((layers, 2)),
                          np.zeros((layers, 4), np.int64))
    except Exception:  # noqa: BLE001 (a worker's own call raises it, on its thread, where the diff reports it)
        pass


def _compile(numba: Any, cache: bool) -> dict[str, Any]:
    """The helpers first (the row loops call them by their module names), then the row loops."""
    opts: dict[str, Any] = dict(nogil=True, fastmath={"reassoc", "contract"})  # (NaN states stay NaN)
    g = globals()
    for name in ("_count_max", "_ulp_row", "_widen_row"):
        g[name] = numba.njit(cache=cache, **opts)(getattr(g[name], "py_func", g[name]))
    # (no fastmath: 1 - cos must round as torch's ops do, and contraction into fused multiply-adds would not)
    for name in ("_one_minus_cos", "_bin"):
        g[name] = numba.njit(cache=cache, nogil=True)(getattr(g[name], "py_func", g[name]))
    loops = {name: numba.njit(cache=cache, **opts)(getattr(g[name], "py_func", g[name])) for name in ("_fused_rows",)}
    loops["_summary_rows"] = numba.njit(cache=cache, nogil=True)(getattr(g["_summary_rows"], "py_func", g["_summary_rows"]))
    return loops


# --- Relative L2 distances between stored and live states, in float64 sums; and whether a difference is noise

def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| in float64 sums (nan when y is empty or zero)."""
    if x.shape[0] == 0:
        return math.nan
    d = (x.float() - y.float()).double()
    den = float(y.double().square().sum())
    return math.sqrt(float(d.square().sum()) / den) if den > 0 else (0.0 if float(d.abs().sum()) == 0 else math.inf)


def row_rel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row ||x_t - y_t|| / ||y_t|` ``[T]`` (float64)."""
    d = torch.linalg.vector_norm((x.float() - y.float()).double(), dim=1)
    n = torch.linalg.vector_norm(y.double(), dim=1)
    return torch.where(n > 0, d / n.clamp_min(1e-300), torch.where(d > 0, torch.inf, 0.0))


COHERENT = 0.2  # mean cosine of the differences at rows of one token above this: a function of the tokens
MIN_PAIRS = 8


def coherent_difference(d: torch.Tensor, tokens: torch.Tensor) -> bool | None:
    """Whether the difference rows ``d`` ``[T, H]`` at rows of the same token point the same way (a mean
    pairwise cosine above COHERENT): the difference is a function of the tokens — another model's states (a
    fine-tune 2 % off: 0.83-0.93 on the tiny models) — not noise added to the states (|0.03|). None when
    fewer than MIN_PAIRS row pairs share a token (nothing to tell them apart)."""
    x = torch.nn.functional.normalize(d.double(), dim=1)
    groups, inverse, counts = torch.unique(tokens, return_inverse=True, return_counts=True)
    sums = torch.zeros(int(groups.numel()), x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, inverse, x)
    pairs = int((counts * (counts - 1)).sum())
    total = float(sums.square().sum() - x.square().sum())  # sum over pairs (i != j) of one token of x_i . x_j
    return None if pairs < 2 * MIN_PAIRS else total / pairs > COHERENT

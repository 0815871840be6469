"""Divergence sums of two sets of hidden states: per token, computed in cache-sized blocks (torch, any device),
then per sample and layer — the sums every reported statistic is a function of.

For each token and layer this reduces the hidden dimension to seven numbers (float64): sum |a-b|,
max |a-b|, the count of values that differ, |a-b|², |a|², |b|² and a·(a-b). Everything the diff
reports is derived from these per-token sums (``summarize``, below), so the pass over a
sample's ``[T, H]`` values of each layer is a handful of vectorized torch reductions on blocks that stay in cache, with
no float64 copy of the states and no per-value temporaries beyond one block.

Where float32 is exact enough and where float64 is needed:
- bf16 and fp16 values convert to float32 exactly, and a-b of two fp32 values is exact when they
  are close (Sterbenz) and otherwise rounds once; every later float32 step is one sum over the hidden
  dimension (at most a few thousand terms, which torch sums pairwise: relative error ~1e-7 of the
  sum of the terms' magnitudes). That is far below any divergence worth reporting. Where a token's squares would
  underflow float32 (all its values below ~1e-19) or their sums overflow it (values near 1e19/sqrt(hidden)), the
  row's sums fall outside 2^-100..2^100 and are added again with float64 products, which hold every float32.
- What float32 cannot do is cancel: ``1 - a·b/(|a||b|)`` for two nearly equal vectors (fp32 vs fp32
  diffs reach 1 - cos ~ 1e-12) and ``|a|² + |b|² - 2a·b``. Neither is ever formed. 1 - cos comes from
  the exact identity ``1 - cos = (|d|² - (|a|-|b|)²) / (2|a||b|)`` with ``|a|-|b| = (2a·d - |d|²) /
  (|a|+|b|)`` (d = a-b), whose terms are all of the size of d: its error is ~1e-7 * (|d|/|a|)², smaller
  than float64's for the direct formula. Those per-token formulas are evaluated in float64 (they cost
  T·L numbers, not T·L·H).
- Sums across tokens and samples are float64 and counts int64 (``summarize``, ``Totals``): a diff adds up 1e9+
  values, which float32 would round to ~1e-4 and counts it would stop at 2^24.
On a CPU where a C compiler built ``kernel.c`` (``hsstore.core.jit.native_library``: once per host and CPU, then
loaded from the cache in ~1 ms) a large diff takes one compiled pass a row (``CLoops.fused_rows``) instead of the
torch ops (~11 passes a block, 9 more for bf16 ULP buckets): 16 lanes at a time, bf16 widened in the loop, d = a - b
in float32 as torch's sub gives it, the sums as fused multiply-adds in float32 blocks of 8 terms a lane joined in
float64 accumulators (within 2^-21 of the terms' magnitudes, 2^-20 without fused multiply-adds; a row whose sums
leave
float32's normal range, 2^-100 to 2^100, is added again with float64 products), count and max |d| from d's bit
patterns, and the ULP buckets from the bits. Counts, the max and the ULP buckets are the torch ops' exactly (for
every bit pattern); the float sums are more accurate than torch's float32 ones, so the two paths agree to float32
rounding of those sums, not to the bit. A sample's sums then reduce per layer on a compiled loop too
(``CLoops.summary_rows``, no torch op per sample: 1 - cos is torch's formula in IEEE float64, compiled without
fused multiply-adds, which ~0.5% of tokens round 1 ULP apart from torch's kernels, so a maximum may differ by 1 ULP
and a token within 1 ULP of a histogram edge may change bins). Which path a diff takes depends on its data alone
(``hsstore.compare.diff.use_compiled``) and on whether the host built the loops, so the same diff on one host
always gives the same numbers.
Per sample: ``summarize`` turns a sample's per-token sums into one float64 row of additive sums per layer
(``COLUMNS``: tokens, values, sum |d|, exact values, |d|², |b|², sum of 1 - cos, ULP buckets), two maxima
(``MAXES``) and a fixed log-scale histogram of per-token 1 - cos. Every reported statistic is a function of sums
over samples (``layer_stats``): a full diff adds every sample's row, a sampled one weights them
(``hsstore.compare.sampling``). Memory does not grow with the number of samples. The 1st percentile of cosine is
read from the histogram (accurate to one bin, ~1% relative).
Range: every finite float32 state is measured (tests/compare/test_diff.py, 1e-30 to 1e18); a reference all zeros at
a layer gives rel-L2 infinite.
"""

from __future__ import annotations

import ctypes
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from hsstore.core.interrupt import ForkSafeLock
from hsstore.core.jit import NativeUnavailable, native_library

# values per block (rows x hidden): on a CPU the block buffers (~1 MiB each) stay in L2/L3 cache; on a
# GPU a block is a whole sample up to this many values (each op is one kernel launch)
BLOCK_VALUES = 1 << 18
GPU_BLOCK_VALUES = 1 << 26
ULP_BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16")
# a value pair in bucket k of ULP_BUCKETS is more than _ULP_STEPS[k-1] ULPs apart, at most _ULP_STEPS[k]
_ULP_STEPS = (0, 1, 2, 4, 8, 16)


@dataclass
class TokenSums:
    """Per-token sums over the hidden dimension, each ``[L, T]`` float64 (``differing``: a count),
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


def bf16_ordered(
    bits: torch.Tensor, out: torch.Tensor | None = None, scratch: torch.Tensor | None = None
) -> torch.Tensor:
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

    def kernel(self) -> CLoops | Literal[False]:
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


def token_sums(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], ws: Workspace, ulps: bool = False) -> TokenSums:
    """Per-token sums of one sample's states: ``a``, ``b`` hold one ``[T, H]`` tensor per layer
    (B is the reference)."""
    L = len(a)
    T, H = a[0].shape
    for x, y in zip(a, b):
        if x.shape != y.shape or x.shape != (T, H):
            raise ValueError(f"states of shape {tuple(x.shape)} and {tuple(y.shape)} cannot be compared")
        if ulps and (x.dtype != torch.bfloat16 or y.dtype != torch.bfloat16):
            raise ValueError(f"ULP buckets count bf16 pairs; these states are {x.dtype} and {y.dtype}")
    out = torch.empty((7, L, T), dtype=torch.float64, device=ws.device)
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


def _fused(
    x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, ulp: torch.Tensor | None, ws: Workspace, kernel: CLoops
) -> None:
    """The seven per-row sums of one layer ``[T, H]`` into ``out [7, T]`` (and the ULP counts of two bf16 layers
    into ``ulp [6]``) in one compiled pass a row."""
    (xa, a16), (yb, b16) = _fused_operand(x, ws, "a"), _fused_operand(y, ws, "b")
    counts = np.zeros(len(_ULP_STEPS), np.int64)
    kernel.fused_rows(xa, yb, ulp is not None and a16 and b16, out.numpy(), counts)
    if ulp is not None:
        ulp += torch.from_numpy(counts)


def _block(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, ws: Workspace) -> None:
    """The seven per-row sums of one block of rows ``[r, H]`` into ``out [7, r]`` (float64): float32 reductions (every
    op writes into a reused buffer: a fresh temporary per block would cost page faults), and the rows whose sums leave
    float32's normal range (``fits_float32``) added again with float64 products, as the compiled loops do."""
    r, H = a.shape
    af, bf = _as_f32(a, ws, "a"), _as_f32(b, ws, "b")
    d, s = ws.buf("d", r, H), ws.buf("s", r, H)
    sums = ws.buf("sums", 7, r)
    torch.sub(af, bf, out=d)
    torch.linalg.vector_norm(d, dim=1, out=sums[3])
    torch.linalg.vector_norm(af, dim=1, out=sums[4])  # (as the C loops: derived from |b|^2, a.d and |d|^2 it was NaN
    torch.linalg.vector_norm(bf, dim=1, out=sums[5])  # for an infinite value, and the two paths' 1 - cos differed)
    torch.sum(torch.mul(af, d, out=s), dim=1, out=sums[6])
    torch.abs(d, out=s)
    torch.sum(s, dim=1, out=sums[0])
    torch.amax(s, dim=1, out=sums[1])
    torch.sum(torch.sign(s, out=s), dim=1, out=sums[2])  # 1 where a value differs, else 0
    sums[3:6].square_()
    out.copy_(sums)
    far = ~fits_float32(out[3], out[4], out[5], out[6])
    if bool(far.any()):  # squares and products of those rows in float64: exact for every float32
        x, y, dx = af[far].double(), bf[far].double(), d[far].double()
        out[0, far], out[3, far], out[4, far] = dx.abs().sum(1), (dx * dx).sum(1), (x * x).sum(1)
        out[5, far], out[6, far] = (y * y).sum(1), (x * dx).sum(1)


FLOAT32_LOW, FLOAT32_HIGH = 2.0**-100, 2.0**100


def fits_float32(dd: torch.Tensor, aa: torch.Tensor, bb: torch.Tensor, ad: torch.Tensor) -> torch.Tensor:
    """Per row, whether sums added in float32 hold what float64 products would (``sums_fit_float32`` in kernel.c):
    every sum finite and below 2^100, |a|^2 and |b|^2 at least 2^-100, and |d|^2 and |a.d| too unless d is 0."""
    lo, hi = FLOAT32_LOW, FLOAT32_HIGH
    inside = (aa >= lo) & (aa < hi) & (bb >= lo) & (bb < hi) & (dd < hi) & (ad.abs() < hi)
    return inside & ((dd == 0) | ((dd >= lo) & (ad.abs() >= lo)))


class CLoops:
    """The loops of ``kernel.c`` (``hsstore.core.jit.native_library``), called with numpy arrays whose dtypes, shapes
    and layouts are checked first (a C loop trusts its pointers). ctypes lets go of the GIL for each call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        P, Int, N = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        self._fused, self._summary = lib.hsstore_fused_rows, lib.hsstore_summary_rows
        self._fused.argtypes, self._fused.restype = [P, P, Int, Int, Int, N, N, P, N, P], None
        self._summary.argtypes, self._summary.restype = [P] * 7 + [N, N, P, N, P, P, P], None

    def fused_rows(self, a: np.ndarray, b: np.ndarray, ulps: bool, out: np.ndarray, ulp: np.ndarray) -> None:
        """Per row of ``a``, ``b`` ``[T, H]`` (bf16 as int16 bit patterns, or float32): the seven sums of ``_block``
        into ``out [7, T]`` float64 (its rows may lie apart: a view of one layer); where ``ulps`` (both bf16) the counts of pairs more than 0, 1, 2, 4, 8, 16 ULPs
        apart added to ``ulp [6]`` int64."""
        T, H = a.shape
        for name, x in (("a", a), ("b", b)):
            _need(name, x, x.dtype in (np.int16, np.float32), (T, H))
        _need("ulp", ulp, ulp.dtype == np.int64, (6,), out=True)
        if T == 0:  # (a layer of no tokens, e.g. a sample whose loss mask is empty under --loss-only)
            return
        rows_apart = out.strides[0] // 8
        if not (
            out.dtype == np.float64
            and out.shape == (7, T)
            and out.strides[1] == 8
            and out.strides[0] % 8 == 0
            and rows_apart >= T
            and out.flags.aligned
            and out.flags.writeable
        ):
            raise ValueError(
                f"out: {out.dtype} {out.shape} strides {out.strides}; the loop takes float64 (7, {T}), "
                "each row contiguous"
            )
        a16, b16 = a.dtype == np.int16, b.dtype == np.int16
        if ulps and not (a16 and b16):
            raise ValueError("ULP counts take two bf16 operands")
        self._fused(a.ctypes.data, b.ctypes.data, a16, b16, ulps, T, H, out.ctypes.data, rows_apart, ulp.ctypes.data)

    def summary_rows(
        self, per_token: Sequence[np.ndarray], edges: np.ndarray, sums: np.ndarray, maxes: np.ndarray, hist: np.ndarray
    ) -> None:
        """One sample's per-layer sums from its per-token sums (dd, aa, bb, ad, sum_abs, differing, max_abs, each
        ``[L, T]`` float64), as ``summarize`` makes them with torch's ops: ``sums [L, 5]``, ``maxes [L, 2]``
        (float64) and ``hist [L, len(edges) + 1]`` (int64, added to; the bins of ``edges``, float64, as torch.bucketize's)."""
        L, T = per_token[0].shape
        for x in per_token:
            _need("per-token sums", x, x.dtype == np.float64, (L, T))
        _need("edges", edges, edges.dtype == np.float64, edges.shape[:1])
        _need("sums", sums, sums.dtype == np.float64, (L, 5), out=True)
        _need("maxes", maxes, maxes.dtype == np.float64, (L, 2), out=True)
        _need("hist", hist, hist.dtype == np.int64, (L, len(edges) + 1), out=True)
        self._summary(
            *(x.ctypes.data for x in per_token),
            L,
            T,
            edges.ctypes.data,
            len(edges),
            sums.ctypes.data,
            maxes.ctypes.data,
            hist.ctypes.data,
        )


def _need(name: str, x: np.ndarray, dtype_ok: bool, shape: tuple[int, ...], out: bool = False) -> None:
    """``x`` as a C loop reads it (or, ``out``, writes it): the dtype, this shape, contiguous, aligned (writable)."""
    if not (
        dtype_ok and x.shape == shape and x.flags.c_contiguous and x.flags.aligned and (x.flags.writeable or not out)
    ):
        raise ValueError(
            f"{name}: {x.dtype} {x.shape} (contiguous: {x.flags.c_contiguous}, writable: "
            f"{x.flags.writeable}); the loop takes {shape}"
        )


_kernel: CLoops | Literal[False] | None = None
_kernel_lock = ForkSafeLock()
SOURCE = Path(__file__).with_name("kernel.c")


def compiled_kernel() -> CLoops | Literal[False]:
    """The C loops, built on first use (``hsstore.core.jit.native_library``: once per host, then loaded from the
    cache); False, with one warning, where no C compiler builds them (torch's ops serve, ~2-3x slower)."""
    global _kernel
    with _kernel_lock:  # worker threads ask together on their first sample
        if _kernel is None:
            try:
                _kernel = CLoops(native_library(SOURCE))
            except Exception as e:  # noqa: BLE001 (an optimisation: whatever keeps it from loading, torch's ops serve)
                why = str(e) if isinstance(e, NativeUnavailable) else f"{type(e).__name__}: {e}"
                warnings.warn(
                    f"hsstore: the C loops of diff, check and audit were not built ({why}); torch's ops "
                    "compare the states, ~2-3x slower on a CPU (install a C compiler, or set CC)",
                    stacklevel=1,
                )
                _kernel = False
    return _kernel


# --- One sample's per-layer sums from its per-token sums, and the statistics reported from sums over samples

EDGES = torch.logspace(-12, math.log10(2.0), 1201, dtype=torch.float64)  # bins of (1 - cos)
N_BINS = len(EDGES) + 1
COLUMNS = ("tokens", "values", "sum_abs", "exact", "sq_diff", "sq_ref", "cos1m_sum") + tuple(
    f"ulp_{b}" for b in ULP_BUCKETS
)
MAXES = ("max_abs", "cos1m_max")
C = {name: i for i, name in enumerate(COLUMNS)}
M = {name: i for i, name in enumerate(MAXES)}


@dataclass
class SampleSums:
    """One sample's sums: ``sums [L, len(COLUMNS)]`` float64, ``maxes [L, 2]``, ``hist [L, N_BINS]`` int64."""

    key: str
    sums: np.ndarray
    maxes: np.ndarray
    hist: np.ndarray

    def rel_l2(self, layer_index: int = -1) -> float:
        return ratio_of_norms(self.sums[layer_index, C["sq_diff"]], self.sums[layer_index, C["sq_ref"]])


def ratio_of_norms(sq_diff: float, sq_ref: float) -> float:
    """rel-L2 from its squared sums: infinite where the reference is all zeros and the other side is not (a
    broken extractor's zeros must never read as agreement), 0 where both are."""
    return math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)


def one_minus_cos(dd: torch.Tensor, aa: torch.Tensor, bb: torch.Tensor, ad: torch.Tensor) -> torch.Tensor:
    """Per-token 1 - cos(a, b) in float64 from the per-token sums, without cancellation (see the module docstring).
    Two zero vectors agree (0); one zero vector does not (1)."""
    dd, aa, bb, ad = dd.double(), aa.double(), bb.double(), ad.double()
    na, nb = aa.sqrt(), bb.sqrt()
    norm_gap = (2 * ad - dd) / (na + nb).clamp_min(1e-300)  # |a| - |b|
    num = (dd - norm_gap * norm_gap).clamp_min(0.0)
    den = 2 * na * nb
    degenerate = torch.where(na == nb, 0.0, 1.0).to(dd.dtype)
    return torch.where(den > 0, num / den.clamp_min(1e-300), degenerate).clamp(0.0, 2.0)


def summarize(key: str, ts: TokenSums, hidden: int, ws: Workspace | None = None) -> SampleSums:
    """The per-layer sums of one sample from its per-token sums ``[L, T]``: on ``ws``'s compiled loops where it
    takes them (one pass, no torch op: maxima within 1 ULP, a histogram that moves only tokens within 1 ULP of an
    edge, sums within float64 rounding), else
    torch's ops."""
    kernel = ws.kernel() if ws is not None and ts.dd.device.type == "cpu" else False
    if kernel:
        return _summarize_compiled(key, ts, hidden, kernel)
    L, T = ts.dd.shape
    omc = one_minus_cos(ts.dd, ts.aa, ts.bb, ts.ad)  # [L, T]
    cols = torch.zeros((L, len(COLUMNS)), dtype=torch.float64, device=omc.device)
    cols[:, C["tokens"]] = T
    cols[:, C["values"]] = T * hidden
    cols[:, C["sum_abs"]] = ts.sum_abs.double().sum(1)
    cols[:, C["exact"]] = T * hidden - ts.differing.double().sum(1)
    cols[:, C["sq_diff"]] = ts.dd.double().sum(1)
    cols[:, C["sq_ref"]] = ts.bb.double().sum(1)
    cols[:, C["cos1m_sum"]] = omc.sum(1)
    if ts.ulp is not None:  # counts above 0, 1, 2, 4, 8, 16 ULPs -> the buckets of ULP_BUCKETS
        above = torch.cat([ts.ulp, torch.zeros((L, 1), dtype=torch.float64, device=ts.ulp.device)], dim=1)
        below = torch.cat([cols[:, C["values"] : C["values"] + 1], ts.ulp], dim=1)
        cols[:, C["ulp_0"] :] = below - above
    maxes = (
        torch.stack([ts.max_abs.amax(1).double(), omc.amax(1)], dim=1)
        if T
        else torch.zeros((L, 2), dtype=torch.float64)
    )
    bins = torch.bucketize(omc, EDGES.to(omc.device)) + N_BINS * torch.arange(L, device=omc.device)[:, None]
    hist = torch.bincount(bins.view(-1), minlength=N_BINS * L).view(L, N_BINS)
    return SampleSums(key, cols.cpu().numpy(), maxes.cpu().numpy(), hist.cpu().numpy())


_EDGES = EDGES.numpy()


def _summarize_compiled(key: str, ts: TokenSums, hidden: int, kernel: Any) -> SampleSums:
    L, T = ts.dd.shape
    part, maxes = np.zeros((L, 5)), np.zeros((L, len(MAXES)))
    hist = np.zeros((L, N_BINS), dtype=np.int64)
    kernel.summary_rows(
        [x.numpy() for x in (ts.dd, ts.aa, ts.bb, ts.ad, ts.sum_abs, ts.differing, ts.max_abs)],
        _EDGES,
        part,
        maxes,
        hist,
    )
    cols = np.zeros((L, len(COLUMNS)))
    cols[:, C["tokens"]], cols[:, C["values"]] = T, T * hidden
    cols[:, C["sum_abs"]], cols[:, C["exact"]] = part[:, 0], T * hidden - part[:, 1]
    cols[:, C["sq_diff"]], cols[:, C["sq_ref"]], cols[:, C["cos1m_sum"]] = part[:, 2], part[:, 3], part[:, 4]
    if ts.ulp is not None:  # as summarize's torch path
        ulp = ts.ulp.numpy()
        cols[:, C["ulp_0"] :] = np.concatenate([cols[:, C["values"] : C["values"] + 1], ulp], axis=1) - np.concatenate(
            [ulp, np.zeros((L, 1))], axis=1
        )
    return SampleSums(key, cols, maxes, hist)


class Totals:
    """Running sums over samples (optionally weighted): the full diff's accumulator."""

    def __init__(self, n_layers: int) -> None:
        self.sums = np.zeros((n_layers, len(COLUMNS)))
        self.maxes = np.zeros((n_layers, len(MAXES)))
        self.hist = np.zeros((n_layers, N_BINS), dtype=np.int64)

    def add(self, s: SampleSums) -> None:
        self.sums += s.sums
        np.maximum(self.maxes, s.maxes, out=self.maxes)
        self.hist += s.hist


def cos_p01(hist: np.ndarray, tokens: float) -> float:
    """1st percentile of per-token cosine: upper edge of the bin holding the 99th percentile of 1-cos."""
    if tokens <= 0:
        return 1.0
    target = math.ceil(0.99 * tokens)
    idx = int(np.searchsorted(np.cumsum(hist), target))
    if idx == 0:
        return 1.0
    return 1.0 - float(EDGES[min(idx, len(EDGES) - 1)])


def layer_stats(sums: np.ndarray, maxes: np.ndarray, hist: np.ndarray, ulps: bool) -> dict[str, Any]:
    """The reported statistics of one layer from its sums ``[len(COLUMNS)]``, maxima and histogram."""
    s = {name: float(sums[i]) for name, i in C.items()}
    n = max(1.0, s["values"])
    out: dict[str, Any] = {
        "tokens": int(round(s["tokens"])),
        "mean_abs": s["sum_abs"] / n,
        "max_abs": float(maxes[M["max_abs"]]),
        "rel_l2": ratio_of_norms(s["sq_diff"], s["sq_ref"]),
        "cos_mean": 1.0 - s["cos1m_sum"] / max(1.0, s["tokens"]),
        "cos_min": 1.0 - float(maxes[M["cos1m_max"]]),
        "cos_p01": cos_p01(hist, s["tokens"]),
        "bit_exact": s["exact"] / n,
    }
    if ulps:
        counts = [s[f"ulp_{b}"] for b in ULP_BUCKETS]
        total = max(1.0, sum(counts))
        out["ulp_distribution"] = {b: c / total for b, c in zip(ULP_BUCKETS, counts)}
    return out


def verdict(ratio: float, dtype: str, noise_factor: float) -> str:
    if ratio <= noise_factor:
        return f"within precision noise ({ratio:.2f}x the {dtype} floor)"
    return f"beyond precision noise ({ratio:.1f}x the {dtype} floor)"


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

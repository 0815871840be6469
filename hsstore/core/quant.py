"""FP8 storage precision: hidden states as float8 e4m3 codes with one power-of-two float32 scale per
token (per layer, or per block of channels), quantized and dequantized by pure tensor math.

Why these choices (measured in docs/notes/benchmarks-history.md, "Which scale"):
- e4m3 (3 mantissa bits) rather than e5m2: a scale per token removes the need for e5m2's range, and
  e4m3 rounds half as coarsely.
- One scale per token and layer: its cost is 4 bytes per token and layer (0.08 % at hidden 5120) and
  it keeps each layer's own range; one scale over all layers together (speculators' anchor) lets a
  large layer push a small one's values into e4m3's subnormals.
- Scales are powers of two (``amax / scale`` in [224, 448)): dividing by one is exact, so a value is
  rounded exactly once (to the e4m3 grid), and dequantizing is exact in bf16 (an e4m3 value times a
  power of two is a bf16 value). The same codes and the same bf16 values come out on any device.
  Where the scale were ``amax / 448`` exactly, the error would not change measurably (e4m3 is a
  floating-point format: the scale only moves where subnormals start).

Non-finite inputs: a row's scale is taken over its finite values; NaN and +-Inf are stored as NaN
(e4m3 "fn" has no infinity). Health checks refuse such states before they are stored unless asked not to.

Dequantizing FP8 e4m3 codes to bf16 on the CPU, exactly, at memory-like speed (``dequantize_bf16_bits``, what
``dequantize`` and the read path call there):

An e4m3 code times a power of two 2**k is a bf16 value, and its bf16 bit pattern is the pattern of the
code's value (one 256-entry table) with k added to the exponent field: ``bits = table[c] + (k << 7)``
for every code but +-0 and NaN, which stay as they are. A numba-compiled loop does that in one pass
(~1 byte in, 2 out; ~6.5 GB/s of bf16 per core here, against ~1.9 GB/s for the numpy table path and
~0.1 GB/s for torch's float8 conversion), with the GIL released so layers dequantize side by side.

The exponent add is exact only while every result stays a normal bf16 number: scales 2**k with k in
[K_MIN, K_MAX]. Rows with other scales (states near 1e-33 or 1e36; not seen in models) go through the
table path, which rounds through float64 like torch does. Both paths give the same bits where both apply.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsstore.core.interrupt import ForkSafeLock
from hsstore.core.schema.reports import StorageError

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
NAN_CODE = 0x7F


@dataclass(frozen=True)
class Quantized:
    """FP8 states: ``codes`` uint8 ``[T, H]`` (e4m3 bit patterns) and ``scales`` float32 ``[T, G]``
    (one per token and block of ``H // G`` channels); value = e4m3(code) * scale."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @property
    def fp8(self) -> torch.Tensor:
        """The codes as a ``torch.float8_e4m3fn`` view (no copy)."""
        return self.codes.view(FP8)


def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """The power of two ``s`` with ``amax / s`` in [224, 448) for each (finite, >= 0) ``amax``; 1 for 0."""
    _, exp = torch.frexp(amax.float() / FP8_MAX)
    return torch.ldexp(torch.ones_like(amax, dtype=torch.float32), exp)


def _row_amax(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(amax over finite values per block, mask of non-finite values or None if there are none).
    On a GPU nothing syncs with the host: the mask is always built."""
    mag = blocks.abs()
    amax = mag.amax(dim=-1)
    if blocks.device.type == "cpu" and bool(torch.isfinite(amax).all()):
        return amax, None
    finite = torch.isfinite(mag)
    return torch.where(finite, mag, 0).amax(dim=-1), ~finite


def quantize(x: torch.Tensor, block: int | None = None) -> Quantized:
    """``x`` ``[T, H]`` (any float dtype, any device) as e4m3 codes with power-of-two scales, one per
    token and ``block`` channels (default: the whole row). Runs where ``x`` is, without a host sync on GPUs."""
    if x.dim() != 2:
        raise ValueError(f"quantize takes [tokens, hidden] states, got shape {tuple(x.shape)}")
    T, H = x.shape
    b = H if block is None else int(block)
    if b <= 0 or H % b:
        raise ValueError(f"block {block} does not divide hidden size {H}")
    blocks = x.detach().reshape(T, H // b, b)  # (tokens, blocks per token, channels per block)
    amax, bad = _row_amax(blocks)
    scales = pow2_scales(amax)  # (tokens, blocks)
    codes = (blocks.float() / scales[..., None]).to(FP8).view(torch.uint8)
    if bad is not None:
        codes = torch.where(bad, NAN_CODE, codes)
    return Quantized(codes.reshape(T, H), scales)


def dequantize(q: Quantized, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The states ``[T, H]`` in ``dtype``, exact for bf16/fp32 (any device; on the CPU, bf16 output
    takes ``dequantize_bf16_bits``'s compiled path, ~60x faster than torch's float8 conversion)."""
    codes, scales = q.codes, q.scales
    if codes.device.type == "cpu" and dtype == torch.bfloat16:
        bits = dequantize_bf16_bits(codes.numpy(), scales.numpy())
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    T, H = codes.shape
    G = scales.shape[-1]
    vals = codes.view(FP8).reshape(T, G, H // G).float() * scales[..., None]
    return vals.reshape(T, H).to(dtype)


# --- Dequantizing on the CPU: bf16 bit patterns of codes times power-of-two scales, in one compiled pass.

# e4m3 magnitudes lie in [2**-9, 448]: bf16 biased exponents 118..135. Adding k keeps them in 1..254
# (normal, finite) for k in [-117, 119].
K_MIN, K_MAX = -117, 119

_E4M3_F32 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
_PAIR_TABLES: dict[int, np.ndarray] = {}
_SINGLE_TABLES: dict[int, np.ndarray] = {}
_codes = np.arange(256)
# which codes take the exponent add: all but +-0 (0x00, 0x80) and NaN (0x7F, 0xFF)
_ADD_MASK = np.where(((_codes & 0x7F) == 0) | ((_codes & 0x7F) == 0x7F), 0, 0xFFFF).astype(np.int64)
_kernel: Any = None
_kernel_lock = ForkSafeLock()  # (held while numba compiles: a fork then must not keep it held)


def single_table(k: int) -> np.ndarray:
    """bf16 bit patterns (uint16) of every e4m3 code times 2**k."""
    t = _SINGLE_TABLES.get(k)
    if t is None:
        vals = (_E4M3_F32.double() * 2.0**k).to(torch.bfloat16)
        t = _SINGLE_TABLES[k] = vals.view(torch.int16).numpy().view(np.uint16).copy()
    return t


def _pair_table(k: int) -> np.ndarray:
    t = _PAIR_TABLES.get(k)
    if t is None:
        one = single_table(k).astype(np.uint32)
        pairs = np.arange(1 << 16, dtype=np.uint32)
        # little-endian: the first code of a pair is the low byte and its bf16 the low half
        t = _PAIR_TABLES[k] = one[pairs & 0xFF] | (one[pairs >> 8] << 16)
    return t


def scale_exponents(scales: np.ndarray) -> np.ndarray:
    """k with ``scales == 2**k`` (int32); raises ValueError if a scale is not a positive power of two."""
    mant, exp = np.frexp(scales.astype(np.float32, copy=False))
    if not np.all(mant == 0.5):
        raise ValueError("FP8 scales must be positive powers of two")
    return (exp - 1).astype(np.int32)


def _exponent_add(rows: Any, ks: Any, table: Any, add_mask: Any, dest: Any) -> None:  # pragma: no cover (compiled)
    for r in range(rows.shape[0]):
        add = ks[r] << 7
        for j in range(rows.shape[1]):
            c = rows[r, j]
            dest[r, j] = table[c] + (add & add_mask[c])


def _compiled_kernel() -> Any:
    """``_exponent_add`` compiled on first use (numba caches the machine code on disk where it can write,
    so later processes load it: ~0.5-1 s once per process instead of ~2 s); False where numba cannot be
    imported (e.g. a numpy newer than it supports): the table path then serves, with one warning."""
    global _kernel
    with _kernel_lock:  # layer threads call this together on a sample's first read
        if _kernel is None:
            try:
                import numba
            except ImportError as e:
                warnings.warn(
                    f"hsstore: numba cannot be imported ({e}); FP8 states are dequantized by the "
                    "numpy table path, ~3x slower (pip install -U numba to restore it)",
                    stacklevel=3,
                )
                _kernel = False
                return _kernel
            from hsstore.core.jit import JitLoops

            _kernel = JitLoops(lambda cache: {"add": numba.njit(nogil=True, cache=cache)(_exponent_add)})
    return _kernel


def _table_path(rows: np.ndarray, ks: np.ndarray, dest: np.ndarray) -> None:
    """One numpy ``take`` per distinct k over pairs of codes (any k; ~1.9 GB/s of bf16 per core)."""
    paired = rows.shape[1] % 2 == 0
    src = rows.view(np.uint16) if paired else rows
    dst = dest.view(np.uint32) if paired else dest
    table = _pair_table if paired else single_table
    uniq = np.unique(ks)
    if len(uniq) == 1:  # (mode="clip": every index is in range; "raise" would buffer the output)
        np.take(table(int(uniq[0])), src, out=dst, mode="clip")
        return
    for k in uniq:
        sel = np.flatnonzero(ks == k)
        dst[sel] = np.take(table(int(k)), src[sel], mode="clip")


def dequantize_bf16_bits(
    codes: np.ndarray, scales: np.ndarray, out: np.ndarray | None = None, compiled: bool = True
) -> np.ndarray:
    """bf16 bit patterns (uint16, shape of ``codes``) of e4m3 ``codes`` (uint8 ``[..., H]``) times
    ``scales`` (``[..., G]``, powers of two, one per block of ``H // G`` codes). Exact.
    ``compiled=False`` takes the numpy table path (the reference the compiled loop is tested against)."""
    H, G = codes.shape[-1], scales.shape[-1]
    b = H // G
    rows = np.ascontiguousarray(codes).reshape(-1, b)  # one row per scale
    ks = scale_exponents(scales).reshape(-1)
    if out is None:
        out = np.empty(codes.shape, dtype=np.uint16)
    dest = out.reshape(-1, b)  # ``out`` may be a strided view (e.g. one layer of [T, n, H]) with whole rows
    if not np.shares_memory(dest, out) or dest.strides[-1] != 2:
        raise ValueError("out must hold whole rows (its last axis contiguous)")
    if rows.size == 0:
        return out
    kernel = compiled and K_MIN <= int(ks.min()) and int(ks.max()) <= K_MAX and _compiled_kernel()
    if kernel:
        kernel("add", rows, ks.astype(np.int64), single_table(0), _ADD_MASK, dest)
    else:
        _table_path(rows, ks, dest)
    return out


# --- How far stored (quantized) states are from the states as computed: additive statistics per layer.

FIELDS = ("tokens", "sum_sq_err", "sum_sq_ref", "cos_sum", "cos_min", "max_abs")


def error_tensor(ref: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """``[tokens, sum (s-r)^2, sum r^2, sum of per-token cosine, min cosine, max |s-r|]`` (float64,
    on the states' device) of ``stored`` against ``ref``, both ``[T, H]``. Non-finite values count as 0."""
    r = torch.nan_to_num(ref.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    s = torch.nan_to_num(stored.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    if r.shape[0] == 0:
        return torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64, device=r.device)
    d = s - r
    acc = None if r.device.type == "cpu" else torch.float64  # CPU float32 sums are cascaded (accurate), fast
    nr, ns = torch.linalg.vector_norm(r, dim=1), torch.linalg.vector_norm(s, dim=1)
    denom = nr * ns
    # two zero rows agree (cosine 1); a zero row against a non-zero one does not (0)
    cos = torch.where(denom > 0, (r * s).sum(dim=1) / denom.clamp_min(1e-30), (nr == ns).float()).clamp(-1, 1)
    return torch.stack(
        [
            r.new_full((), float(r.shape[0]), dtype=torch.float64),  # a fill, not a copy (which would sync)
            torch.linalg.vector_norm(d, dtype=acc).double().square(),
            torch.linalg.vector_norm(r, dtype=acc).double().square(),
            cos.sum(dtype=acc).double(),
            cos.min().double(),
            d.abs().amax().double(),
        ]
    )


def from_error_tensor(values: list[float]) -> dict[str, float]:
    """The additive record of one unit and layer from ``error_tensor(...).tolist()``."""
    out = dict(zip(FIELDS, values))
    out["tokens"] = int(out["tokens"])
    return out


def merge(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """One record from many (sums add; minimum cosine and maximum error are kept)."""
    out: dict[str, float] = {
        "tokens": 0,
        "sum_sq_err": 0.0,
        "sum_sq_ref": 0.0,
        "cos_sum": 0.0,
        "cos_min": 1.0,
        "max_abs": 0.0,
    }
    for p in parts:
        for k in ("tokens", "sum_sq_err", "sum_sq_ref", "cos_sum"):
            out[k] += p[k]
        out["cos_min"] = min(out["cos_min"], p["cos_min"])
        out["max_abs"] = max(out["max_abs"], p["max_abs"])
    return out


def summary(e: Mapping[str, float]) -> StorageError:
    """rel-L2 (||stored - ref|| / ||ref|| over all values), cosine mean and min per token, max abs error."""
    ref = e["sum_sq_ref"]
    rel = math.sqrt(e["sum_sq_err"] / ref) if ref > 0 else (0.0 if e["sum_sq_err"] == 0 else math.inf)
    return StorageError(
        tokens=int(e["tokens"]),
        rel_l2=rel,
        cos_mean=e["cos_sum"] / max(1, e["tokens"]),
        cos_min=e["cos_min"],
        max_abs=e["max_abs"],
    )

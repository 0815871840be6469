"""Dequantizing FP8 e4m3 codes to bf16 on the CPU, exactly, at memory-like speed.

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

import warnings
from typing import Any

import numpy as np
import torch

from hsstore.core.interrupt import ForkSafeLock

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

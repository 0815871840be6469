"""Whole-layer value bugs of a writer: correct states with one transform applied to every value — scaled by a
constant, clipped at ±c (an fp16 overflow clamped to 65504), or the bytes of the other 16-bit float type
read as the stored one (fp16 bits read as bf16). Each is seen by undoing it: the layer is named by the
transform when, undone, its healthy rows are within precision noise of the truth. An fp32 layer whose
every value is a bf16 (or fp16) value was computed at that precision: named, with the ``--dtype`` that
judges it.

Without these, a cache where every sample has such a bug read as "states of other weights" (every sample
beyond noise in 2+ layers), and a clip that hits only row 0 (the attention-sink row, where activations
are largest) read as "states of a suffix".
"""

from __future__ import annotations

import math

import torch

from hsstore.compare.distance import rel_l2

CLIP_SLACK = 2.0 ** -7  # the truth must exceed the stored maximum by more than bf16's rounding to call it clipped
OTHER_16BIT = {torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}
NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def transform_fits(s: torch.Tensor, truth: torch.Tensor, healthy: torch.Tensor, noise: float | None,
                   noise_factor: float) -> dict[str, tuple[float, str]]:
    """For each transform that could explain stored ``s`` ``[T, H]`` against ``truth``: (rel-L2 of the
    healthy rows once it is undone, the transform in words). A fitted scale alpha is a candidate only when
    it is itself a difference beyond the precision noise (``|alpha - 1| > noise_factor x noise``: rel-L2 of
    alpha x truth against the truth): the measured noise of the cache's dtype sets how small a scale is
    seen (x 1.001 in an fp32 cache, whose noise is ~1e-7; not in a bf16 one, whose rounding is ~3e-3)."""
    out: dict[str, tuple[float, str]] = {}
    sf, tf = s[healthy].double(), truth[healthy].double()
    if sf.numel() == 0:
        return out
    den = float(tf.square().sum())
    if den > 0:
        alpha = float((sf * tf).sum()) / den
        if alpha > 0 and noise is not None and abs(alpha - 1.0) > noise_factor * noise:
            out["scaled"] = (rel_l2(sf, alpha * tf), f"every value is the truth x {_scale_words(alpha)}")
    c = float(sf.abs().max())
    if c > 0 and float(tf.abs().max()) > c * (1.0 + CLIP_SLACK):
        hit = int((tf.abs() > c * (1.0 + CLIP_SLACK)).any(1).sum())
        out["clipped"] = (rel_l2(sf, tf.clamp(-c, c)), f"values clipped at +-{c:.6g} (the truth reaches "
                                                       f"{float(tf.abs().max()):.6g}, in {hit} row(s))")
    other = OTHER_16BIT.get(s.dtype)
    if other is not None:
        v = s.view(other).double()
        ok = torch.isfinite(v).all(1)
        if bool(ok.any()):
            out["wrong_dtype"] = (rel_l2(v[ok], truth[ok].double()),
                                  f"the bytes are {NAMES[other]} values read as {NAMES[s.dtype]}")
    if s.dtype == torch.float32 and (narrow := narrower_values(sf)) is not None:  # (a scan of the layer)
        out["wrong_dtype"] = (0.0, f"every value is a {narrow} value stored as fp32: the states were computed (or "
                                   f"rounded) at {narrow}, not at fp32; audit again with --dtype {narrow} to judge "
                                   "them at that precision")
    return {k: (r, w) for k, (r, w) in out.items() if math.isfinite(r)}


def _scale_words(alpha: float) -> str:
    """The fitted scale with enough digits to show how far it is from 1 (1.001, 0.9999)."""
    digits = max(4, 2 - math.floor(math.log10(abs(alpha - 1.0)))) if alpha != 1.0 else 4
    return f"{alpha:.{digits}g}"


def narrower_values(x: torch.Tensor) -> str | None:
    """'bf16' or 'fp16' when every (finite, healthy) fp32 value of ``x`` is exactly a value of that type."""
    x = x.float()
    if x.numel() < 2 or not bool(torch.isfinite(x).all()) or not bool(x.any()):
        return None
    if bool((x.view(torch.int32) & 0xFFFF).eq(0).all()):
        return "bf16"
    if bool(x.abs().max() <= 65504.0) and bool(x.half().float().eq(x).all()):
        return "fp16"
    return None

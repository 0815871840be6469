"""Storage precisions by name: what a manifest, a build plan and provenance record, without the tensor
math (hsstore.core.quant), so planning a build never imports torch."""

from __future__ import annotations

PRECISIONS = ("fp8-e4m3",)
SCALE_SCHEME = "per-token-pow2"  # what provenance records as environment.storage.scale


def codec_for_codes(codec: str) -> str:
    """The codec FP8 codes are stored with when ``codec`` is asked for: a byte shuffle does nothing to
    1-byte values, so "shuffle-zstd" becomes plain "zstd" (the same size, ~1.7x faster to decode)."""
    return "zstd" if codec == "shuffle-zstd" else codec


def parse_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise ValueError(f"unknown storage precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return name

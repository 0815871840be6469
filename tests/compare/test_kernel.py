"""The diff kernel's two CPU paths, torch ops and compiled loops, give the same per-token sums to the bit:
a diff may take either (``hsstore.compare.diff.use_compiled``) without changing a number."""

from __future__ import annotations

import pytest
import torch

from hsstore.compare.kernel import TokenSums, Workspace, token_sums

FIELDS = ("sum_abs", "max_abs", "differing", "dd", "aa", "bb", "ad", "ulp")


def _every_bf16() -> torch.Tensor:
    """All 65,536 bf16 bit patterns (NaNs, infinities, -0, subnormals), as ``[256, 256]``."""
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(256, 256)


def _both(a: list[torch.Tensor], b: list[torch.Tensor], ulps: bool) -> tuple[TokenSums, TokenSums]:
    return token_sums(a, b, Workspace("cpu", compiled=True), ulps), token_sums(a, b, Workspace("cpu", compiled=False), ulps)


def _assert_same(x: TokenSums, y: TokenSums) -> None:
    for name in FIELDS:
        u, v = getattr(x, name), getattr(y, name)
        if u is None or v is None:
            assert u is v, name
            continue
        torch.testing.assert_close(u, v, rtol=0, atol=0, equal_nan=True, msg=name)


def test_ulp_buckets_agree_on_every_bf16_pattern() -> None:
    """Against a shuffle, its own negation (opposite-sign NaNs: the torch path's int16 difference wrapped
    into a small distance), and neighbours a few patterns away."""
    a = _every_bf16()
    bits = a.view(torch.int16).to(torch.int32)
    g = torch.Generator().manual_seed(0)
    shuffled = a.flatten()[torch.randperm(a.numel(), generator=g)].view(256, 256)
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

"""A unit's per-layer health statistics (hsstore.storage.stats) of states near float32's range."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hsstore.storage.stats import stats_tensor
from hsstore.storage.store import Store
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import LAYERS, make_samples, new_variant


@pytest.mark.parametrize("scale", [1e20, 1e30, 1e37])
def test_finite_states_whose_squares_overflow_float32_give_finite_stats_and_a_readable_unit(tmp_path: Path, scale):
    """Sums of squares of finite fp32 states past ~1e19 overflow float32: the commit record held ``Infinity``
    (not JSON), so the variant could never be read again. The sums are float64 there; the unit reads back."""
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(0)) * scale
    head = stats_tensor(x, [20, 30])
    want = x.double()
    assert torch.isfinite(head).all(), head
    assert head[1].item() == pytest.approx(want.sum().item(), rel=1e-5)
    assert head[2].item() == pytest.approx((want**2).sum().item(), rel=1e-5)

    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store, dtype="fp32")
    samples = make_samples([20, 30])
    layers = sorted({i for ids in LAYERS.values() for i in ids})
    UnitWriter(store, vid).write(samples, {i: x for i in layers})
    got = Store.open(tmp_path / "s.zarr").reader(vid).read(samples[1].key)
    assert torch.equal(got["layers"][layers[0]], x[20:])

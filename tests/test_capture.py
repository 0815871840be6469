"""Capture semantics on the real tiny hybrid model: which state layer i is, and padded-batch equality."""

from __future__ import annotations

import pytest
import torch

from hsstore.capture.run.hooks import LayerCapture, pad_batch
from hsstore.capture.model.spec import ModelSpec


@pytest.fixture(scope="module")
def hybrid():
    model = ModelSpec("builtin:tiny-qwen3_5").load(torch.float32, "cpu", "sdpa")
    assert [t for t in model.config.layer_types].count("linear_attention") == 3
    return model


def test_layer_i_is_hidden_states_i_plus_1_except_the_post_norm_last(hybrid):
    ids = torch.randint(0, 250, (1, 40))
    mask = torch.ones_like(ids)
    cap = LayerCapture(hybrid, 4, [0, 1, 2, 3])
    got = cap.run(ids, mask)
    cap.close()
    with torch.no_grad():
        hs = hybrid(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for i in range(3):
        assert torch.equal(got[i], hs[i + 1]), i
    assert not torch.allclose(got[3], hs[4])  # hidden_states[-1] is after the final norm
    assert torch.allclose(hybrid.model.norm(got[3]), hs[4], atol=1e-6)


def test_final_norm_capture_is_the_post_norm_hidden_state(hybrid):
    ids = torch.randint(0, 250, (2, 30), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    cap = LayerCapture(hybrid, 4, [1, 3, 4])  # id 4 = num_layers: the final norm's output
    got = cap.run(ids, mask)
    cap.close()
    with torch.no_grad():
        hs = hybrid(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert torch.equal(got[4], hs[4]) and torch.equal(got[1], hs[2])
    assert not torch.equal(got[3], got[4])
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        LayerCapture(hybrid, 4, [5])


def test_stops_after_the_deepest_captured_layer(hybrid):
    calls = []
    h = hybrid.model.layers[3].register_forward_pre_hook(lambda *a: calls.append(1))
    cap = LayerCapture(hybrid, 4, [1])
    cap.run(torch.randint(0, 250, (1, 8)), torch.ones(1, 8, dtype=torch.long))
    cap.close()
    h.remove()
    assert calls == []


def test_padded_batch_equals_each_sample_alone_on_linear_and_full_attention_layers(hybrid):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 250, (n,), generator=g) for n in (50, 7, 31)]
    cap = LayerCapture(hybrid, 4, [0, 1, 2, 3])  # 0-2 Gated-DeltaNet, 3 full attention
    ids, mask = pad_batch(seqs, 0, "cpu")
    batched = cap.run(ids, mask)
    for b, s in enumerate(seqs):
        alone = cap.run(s[None], torch.ones(1, len(s), dtype=torch.long))
        for layer in range(4):
            torch.testing.assert_close(batched[layer][b, : len(s)], alone[layer][0], atol=2e-5, rtol=1e-4)
    cap.close()

"""Capture semantics on the real tiny hybrid model: which state layer i is, and padded-batch equality."""

from __future__ import annotations

import pytest
import torch

from hsstore.capture.model.spec import ModelSpec
from hsstore.capture.run.hooks import LayerCapture, pad_batch


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


@pytest.mark.parametrize("builtin", ["builtin:tiny-qwen3_5", "builtin:tiny-llama"])
def test_which_state_each_layer_id_holds_derived_from_the_model(builtin: str):
    """Derived from the loaded model, not assumed: id i < num_layers - 1 is hidden_states[i+1]; the last
    layer's id holds the raw (pre-norm) output, which differs from hidden_states[num_layers] (the final
    norm applied to it); id num_layers holds that post-norm entry. README and docs/guide.md say so."""
    from pathlib import Path

    model = ModelSpec(builtin).load(torch.float32, "cpu", "sdpa")
    n = int(model.config.num_hidden_layers)
    ids = torch.randint(0, 250, (1, 24), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    cap = LayerCapture(model, n, list(range(n + 1)))
    got = cap.run(ids, mask)
    cap.close()
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(hs) == n + 1
    assert all(torch.equal(got[i], hs[i + 1]) for i in range(n - 1))
    assert not torch.allclose(got[n - 1], hs[n])  # the last layer: hsstore keeps the raw output
    assert torch.equal(got[n], hs[n]) and torch.allclose(model.model.norm(got[n - 1]), hs[n], atol=1e-6)
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/guide.md"):
        text = (root / doc).read_text()
        assert "(= hidden_states[i+1])" not in text, f"{doc} says every layer i is hidden_states[i+1]"
        assert "hidden_states[num_layers]" in text, f"{doc} does not say what the last layer's entry is"

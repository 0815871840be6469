"""The cost shape of a capture forward (hsstore.core.flops.ForwardShape) read off a model skeleton on
torch's meta device: parameter counts and layer kinds without a byte of weights (a 27B shape plans in
seconds on a laptop)."""

from __future__ import annotations

from typing import Any

from hsstore.capture.model.spec import text_config
from hsstore.core.flops import ForwardShape


def forward_shape(config: Any, deepest: int, trust_remote_code: bool = False) -> ForwardShape:
    """What decoder layers ``0..deepest`` of ``config``'s model execute per token (``deepest`` = the
    number of layers: all of them, then the final norm)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hsstore.capture.run.hooks import decoder_layers

    tc = text_config(config)
    n = int(tc.num_hidden_layers)
    with torch.device("meta"):  # shapes only: no memory, no initialization
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    run = list(decoder_layers(model, n))[: min(deepest, n - 1) + 1]
    params = sum(p.numel() for layer in run for p in layer.parameters())
    kinds = list(getattr(tc, "layer_types", None) or ["full_attention"] * n)[: len(run)]
    heads = int(tc.num_attention_heads)
    head_dim = int(getattr(tc, "head_dim", None) or tc.hidden_size // heads)
    linear = int(getattr(tc, "linear_num_value_heads", 0) or 0) * int(getattr(tc, "linear_key_head_dim", 0) or 0) \
        * int(getattr(tc, "linear_value_head_dim", 0) or 0)
    return ForwardShape(layer_params=int(params), attention_layers=sum(k != "linear_attention" for k in kinds),
                        attention_width=heads * head_dim, linear_layers=sum(k == "linear_attention" for k in kinds),
                        linear_state=linear)

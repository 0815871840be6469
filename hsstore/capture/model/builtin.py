"""Builtin random-init models and an offline byte-level tokenizer: the embedded default needs no download.

Weights come from a seed on the CPU in fp32 (the same weights for every backend, dtype and device), so
variants of one builtin recipe differ only by how they were computed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hsstore.core.batching import check_fits
from hsstore.core.errors import BadInput

# --- A builtin model's size from its config, checked against the memory budget before its config is even


def min_parameters(tc: Any) -> int:
    """A lower bound on a decoder-only model's parameters: its embedding and every layer's MLP."""

    def num(key: str) -> int:
        v = getattr(tc, key, 0)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    h, inter = num("hidden_size"), num("intermediate_size")
    return num("vocab_size") * h + num("num_hidden_layers") * 3 * h * inter


def check_builtin_fits(tc: Any, model: str) -> None:
    """ResourceLimit when a builtin's weights (drawn in fp32) cannot fit the memory budget."""
    check_fits(
        4 * min_parameters(tc),
        f"{model} with these config overrides ({min_parameters(tc):,} parameters at least, drawn in fp32)",
        "choose smaller [model] config overrides (hidden_size, num_hidden_layers, intermediate_size)",
    )


# ChatML. Its {% generation %} span (reply + <|im_end|>) is exactly what hsstore's own mask method marks
# (tests/capture/test_lossmask.py checks both agree); the generation prompt is the assistant header, newline included.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

BUILTINS: dict[str, dict[str, Any]] = {
    # hybrid like Qwen3.5/3.6: three Gated-DeltaNet linear-attention layers, then one full-attention layer
    "tiny-qwen3_5": {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    "tiny-llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
}
FULL_ATTENTION_INTERVAL = 4
GENERATOR_VERSION = 1  # bump when the weights a (name, seed, config) produces change


def builtin_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte tokens + chat specials) with a chat template; built, never downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves __init__ unannotated
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    return fast


def check_overrides(name: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Each override names a key of the model's config and keeps its kind: a positive count stays a
    positive int, a flag a bool, a number a number, a list a list; anything else is one BadInput."""
    for key, value in overrides.items():
        where = f"[model] config.{key} = {value!r} (builtin:{name})"
        if key not in defaults:
            raise BadInput(
                f"unknown config key {key!r} for builtin:{name} (typo?); it would be ignored by "
                "transformers: use a key of the model's config, e.g. hidden_size, num_hidden_layers"
            )
        default = defaults[key]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise BadInput(f"{where}: expected a boolean (true/false)")
        if isinstance(default, int) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInput(f"{where}: expected an integer")
            if default > 0 and value < 1:
                raise BadInput(f"{where}: expected a positive integer (a size or count)")
        if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise BadInput(f"{where}: expected a number")
        if isinstance(default, list) and not isinstance(value, list):
            raise BadInput(f"{where}: expected a list")


def builtin_config(
    name: str, overrides: dict[str, Any] | None = None, vocab_size: int = 320, drawn_in_memory: bool = True
) -> Any:
    """The transformers config of builtin ``name`` with ``overrides`` applied (checked by key and kind, and,
    when its weights are drawn in CPU memory, by size against the memory budget)."""
    from transformers import AutoConfig

    if name not in BUILTINS:
        raise BadInput(f"unknown builtin model {name!r}; choose one of {', '.join('builtin:' + n for n in BUILTINS)}")
    base = {**BUILTINS[name], "vocab_size": vocab_size}
    model_type = base.pop("model_type")
    overrides = dict(overrides or {})
    if overrides:
        check_overrides(name, {**AutoConfig.for_model(model_type).to_dict(), **base}, overrides)
    kwargs = {**base, **overrides}
    if drawn_in_memory:  # checked before a config of 1e8 layers is even made
        check_builtin_fits(SimpleNamespace(**kwargs), f"builtin:{name}")
    if model_type == "qwen3_5_text" and "layer_types" not in overrides:
        n = int(kwargs["num_hidden_layers"])
        kwargs["layer_types"] = [
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(n)
        ]
    try:
        return AutoConfig.for_model(model_type, **kwargs)
    except (TypeError, ValueError) as e:
        raise BadInput(f"config overrides {overrides} are not valid for builtin:{name}: {e}") from None

"""Whether a model can produce a variant's stored shapes — hidden size, layer count (and every stored layer
id), vocabulary — read from its config alone, so a wrong model is refused before any weights load."""

from __future__ import annotations

from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.schema.record import or_none
from hsstore.storage.store import VariantReader


def model_config(spec: Any) -> Any:
    """The model's config (a builtin's sized to its tokenizer), without loading weights."""
    return spec.config(len(spec.tokenizer())) if spec.builtin is not None else spec.config()


def check_shapes(spec: Any, reader: VariantReader, keys: list[str], config: Any = None) -> tuple[int, int]:
    """(num_layers, vocab) of the model's config; BadInput (exit 2) when it cannot produce the stored shapes
    — read from the config alone, before any weights load."""
    from hsstore.capture.model.spec import text_config

    tc = text_config(config if config is not None else model_config(spec))
    layers, hidden, vocab = int(tc.num_hidden_layers), int(tc.hidden_size), int(tc.vocab_size)
    rec = reader.record
    name = spec.path
    if hidden != rec.hidden_size:
        raise BadInput(f"{name} has hidden_size {hidden}, variant {reader.id} stores states of width {rec.hidden_size}: "
                       "this model cannot produce them; pass the model the cache was made with")
    recorded = or_none(rec.prov.recipe.model.num_layers)
    if isinstance(recorded, int) and recorded != layers:
        raise BadInput(f"{name} has {layers} decoder layers, variant {reader.id} was made by a model with {recorded}: "
                       "pass the model the cache was made with")
    if max(rec.all_layers) > layers:
        raise BadInput(f"variant {reader.id} stores layer {max(rec.all_layers)}, {name} has layers 0..{layers - 1} "
                       f"(and {layers} = after the final norm): pass the model the cache was made with")
    top = max((int(reader.read_tokens(reader.refs[k])[0].max()) for k in keys), default=0)
    if top >= vocab:
        raise BadInput(f"variant {reader.id} holds token id {top}, {name} has a vocabulary of {vocab}: another "
                       "tokenizer's cache; pass the model the cache was made with")
    return layers, vocab

"""Real chat templates (tests/data/chat_templates/*.json, sources cited inside) with tokenizers trained here.

Each fixture holds a model family's chat template verbatim and the family's special tokens; the tokenizer
is a byte-level BPE trained in-process on a small corpus, with those tokens added as the family marks them
(special, or added but not special). Nothing is downloaded.

Templates that print today's date (``strftime_now``) are rendered by the oracle with each call replaced by
the pinned day's text (``undated``): the same day hsstore pins, reached another way.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent / "data" / "chat_templates"
FIXTURES = sorted(p.stem for p in DIR.glob("*.json"))

WORDS = (
    "the a of to and is it four six what plus two three tool call result weather city paris "
    "think answer reason step first then so because sure here python code def return print value "
    "user assistant system hello world data model train loss mask token"
).split()
CORPUS = [
    " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + " 0123456789 {}[]():;,.\"'\n\n"
    for i in range(200)
]


PINNED_DAY = datetime(2024, 7, 26)  # hsstore.capture.inputs.lossmask.PINNED, written out: the oracle does not import it


def load(name: str) -> dict[str, Any]:
    return json.loads((DIR / f"{name}.json").read_text(encoding="utf-8"))


def _trained(vocab_size: int, pre_tokenizer: Any = None) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok.to_str()


@cache
def _default_trained(vocab_size: int) -> str:
    return _trained(vocab_size)


def make_tokenizer(name: str, vocab_size: int = 400, pre_tokenizer: Any = None) -> Any:
    """A fresh PreTrainedTokenizerFast with fixture ``name``'s template and special tokens (GPT-2 style
    byte-level pre-tokenizer unless ``pre_tokenizer`` is given)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fx = load(name)
    t = fx["tokens"]
    named = {k: t[k] for k in ("bos", "eos", "pad") if t[k] is not None}
    trained = _trained(vocab_size, pre_tokenizer) if pre_tokenizer is not None else _default_trained(vocab_size)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(trained),
        chat_template=fx["chat_template"],
        **{f"{k}_token": v for k, v in named.items()},
    )
    extra = [s for s in t["special"] if s not in named.values()]
    if extra:
        fast.add_special_tokens({"additional_special_tokens": extra})
    if t["added"]:
        fast.add_tokens(t["added"])
    return fast


def spans(tok: Any, ids: Any, mask: Any) -> list[str]:
    """Decoded text of each maximal run of masked tokens."""
    out, run = [], []
    for i, m in zip(list(ids) + [None], list(mask) + [0]):
        if m:
            run.append(int(i))
        elif run:
            out.append(tok.decode(run))
            run = []
    return out


def undated(template: str) -> str:
    """``template`` with each ``strftime_now('<format>')`` call replaced by the pinned day's text (Python's
    strftime), so the reference rendering does not depend on the day the tests run."""
    return re.sub(
        r"strftime_now\((['\"])([^'\"]*)\1\)", lambda m: json.dumps(PINNED_DAY.strftime(m.group(2))), template
    )


def reference_ids(tok: Any, conv: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """Token ids of ``conv`` rendered by transformers itself, the date (if any) pinned by ``undated``."""
    return list(
        tok.apply_chat_template(
            conv, chat_template=undated(tok.chat_template), tokenize=True, return_dict=True, **kwargs
        )["input_ids"]
    )


# Conversations the chat tests share, and each family's replies of the rich one as its template marks them.
TWO_TURNS = [
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "It is four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "It is six."},
]


def rich_conversation(sup: dict) -> list[dict]:
    """System prompt, a tool call and its result, reasoning and two user turns, as far as the family allows."""
    args = {"city": "Paris"} if sup.get("object_arguments") else '{"city": "Paris"}'
    m = [{"role": "system", "content": "Be brief."}] if sup["system"] else []
    m.append({"role": "user", "content": "Weather in Paris?"})
    if sup["tools"]:
        m.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": args}}
                ],
            }
        )
        m.append(
            {
                "role": "tool",
                "content": "sunny, 21 C",
                **({"tool_call_id": "call00001"} if sup["tool_call_ids"] else {}),
            }
        )
    reason = {"reasoning_content": "The tool said sunny."} if sup["reasoning"] else {}
    m += [
        {"role": "assistant", "content": "It is sunny.", **reason},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "I cannot know.", **({"reasoning_content": "No tool."} if reason else {})},
    ]
    return m


GOLDEN = {
    "qwen3": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is sunny.<|im_end|>",
        "<think>\nNo tool.\n</think>\n\nI cannot know.<|im_end|>",
    ],
    # a default system prompt when the row has none; tool calls as JSON inside the assistant turn
    "qwen2_5": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is sunny.<|im_end|>",
        "I cannot know.<|im_end|>",
    ],
    # the generation prompt ends in "<think>\n": that much of a think block is prompt, not reply
    "qwen3_5": [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>",
        "The tool said sunny.\n</think>\n\nIt is sunny.<|im_end|>",
        "No tool.\n</think>\n\nI cannot know.<|im_end|>",
    ],
    "llama3": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        "It is sunny.<|eot_id|>",
        "I cannot know.<|eot_id|>",
    ],
    "mistral_nemo": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}", "id": "call00001"}]</s>',
        "It is sunny.</s>",
        "I cannot know.</s>",
    ],
    "gemma2": ["It is sunny.<end_of_turn>", "I cannot know.<end_of_turn>"],
    # harmony: the generation prompt is "<|start|>assistant", so the channel is reply; the last turn's analysis
    # (reasoning) is written and trained on, earlier turns' is dropped by the template; <|end|> closes earlier
    # turns, <|return|> the last
    "gpt_oss": [
        "<|channel|>final<|message|>It is sunny.<|end|>",
        "<|channel|>analysis<|message|>No tool.<|end|><|start|>assistant<|channel|>final<|message|>"
        "I cannot know.<|return|>",
    ],
    # a default system prompt with the pinned date when the row has none; the template renders no tool calls
    "granite3_3": ["It is sunny.<|end_of_text|>", "I cannot know.<|end_of_text|>"],
    # no generation prompt: a reply starts after [/INST] or [/TOOL_RESULTS]; tool calls are reply
    "mistral_small3_2": [
        '[TOOL_CALLS]get_weather[CALL_ID]call00001[ARGS]{"city": "Paris"}</s>',
        "It is sunny.</s>",
        "I cannot know.</s>",
    ],
    "deepseek_r1": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
        "It is sunny.<｜end▁of▁sentence｜>",
        "I cannot know.<｜end▁of▁sentence｜>",
    ],
}

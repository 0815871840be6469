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

WORDS = ("the a of to and is it four six what plus two three tool call result weather city paris "
         "think answer reason step first then so because sure here python code def return print value "
         "user assistant system hello world data model train loss mask token").split()
CORPUS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + " 0123456789 {}[]():;,.\"'\n\n"
          for i in range(200)]


PINNED_DAY = datetime(2024, 7, 26)  # hsstore.capture.inputs.lossmask.PINNED, written out: the oracle does not import it


def load(name: str) -> dict[str, Any]:
    return json.loads((DIR / f"{name}.json").read_text(encoding="utf-8"))


def _trained(vocab_size: int, pre_tokenizer: Any = None) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
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
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(trained),
                                   chat_template=fx["chat_template"], **{f"{k}_token": v for k, v in named.items()})
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
    return re.sub(r"strftime_now\((['\"])([^'\"]*)\1\)", lambda m: json.dumps(PINNED_DAY.strftime(m.group(2))),
                  template)


def reference_ids(tok: Any, conv: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """Token ids of ``conv`` rendered by transformers itself, the date (if any) pinned by ``undated``."""
    return list(tok.apply_chat_template(conv, chat_template=undated(tok.chat_template), tokenize=True,
                                        return_dict=True, **kwargs)["input_ids"])

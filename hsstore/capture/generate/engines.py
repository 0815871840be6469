"""The engines that generate replies: the target in this process (transformers ``generate``, prompts batched
left-padded under a token budget) and an OpenAI-compatible server (hsstore.capture.generate.server).

An engine takes prompts as token ids and returns, per prompt, the generated ids (with the end-of-turn token
when the reply stopped there), why it ended ("stop" or "length") and the wall time of its batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Generated:
    ids: list[int]
    finish_reason: str  # "stop" | "length" | "error"
    seconds: float
    error: str | None = None


def prompt_batches(lengths: Sequence[int], max_new_tokens: int, token_budget: int) -> list[list[int]]:
    """Indices of the prompts in batches, longest first, each within ``token_budget`` once padded to its
    longest prompt plus ``max_new_tokens`` (a prompt alone may exceed it: it gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        width = lengths[batches[-1][0]] + max_new_tokens if batches else 0
        if batches and width * (len(batches[-1]) + 1) <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def end_ids(tok: Any) -> list[int]:
    """The token ids a reply ends at: the tokenizer's end-of-sequence id and the chat template's end-of-turn
    token (<|im_end|>, <|eot_id|>, ...)."""
    out: list[int] = [] if tok.eos_token_id is None else [tok.eos_token_id]
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        i = tok.convert_tokens_to_ids(text) if text in tok.get_vocab() else None
        if i is not None:
            out.append(int(i))
    return sorted(set(int(x) for x in out))


class LocalEngine:
    """The target itself, in this process: ``model`` (loaded by ModelSpec.load on the build's first device
    and dtype) generates batches of left-padded prompts."""

    name = "model"

    def __init__(self, model: Any, tok: Any, pad_id: int, token_budget: int) -> None:
        self.model, self.tok, self.pad_id, self.token_budget = model, tok, pad_id, token_budget
        self.eos = end_ids(tok)

    @property
    def version(self) -> str:
        import torch
        import transformers

        return f"transformers {transformers.__version__}, torch {torch.__version__}"

    def run(self, prompts: list[list[int]], indices: list[int], params: Any,
            on_batch: Callable[[list[int], list[Generated]], None]) -> None:
        """Generate every prompt, ``on_batch(positions, replies)`` after each batch (a checkpoint). Sampling is
        seeded per batch from ``params.seed`` (greedy needs no seed: the same batches give the same tokens)."""
        for b in prompt_batches([len(p) for p in prompts], params.max_new_tokens, self.token_budget):
            on_batch(b, self.batch([prompts[i] for i in b], params, params.seed + b[0] + indices[b[0]]))

    def batch(self, prompts: list[list[int]], p: Any, seed: int) -> list[Generated]:
        import torch

        width = max(len(x) for x in prompts)
        dev = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, x in enumerate(prompts):  # left-padded: every prompt ends where generation starts
            ids[r, width - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[r, width - len(x):] = 1
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), **self.kwargs(p))
        seconds = time.perf_counter() - t0
        return [self._cut(row[width:].tolist(), p, seconds) for row in out.cpu()]

    def kwargs(self, p: Any) -> dict[str, Any]:
        """transformers ``generate`` arguments of the sampling parameters ``p`` (temperature 0: greedy)."""
        kw: dict[str, Any] = {"max_new_tokens": p.max_new_tokens, "eos_token_id": self.eos, "pad_token_id": self.pad_id,
                              "min_new_tokens": 0}
        if p.temperature > 0:
            kw.update(do_sample=True, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or None)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if p.stop:
            kw.update(stop_strings=list(p.stop), tokenizer=self.tok)
        return kw

    def _cut(self, row: list[int], p: Any, seconds: float) -> Generated:
        """A batch row's reply: up to and with its first end token (then the rest is padding); a stop string
        ends it too."""
        for j, t in enumerate(row):
            if t in self.eos:
                return Generated(row[: j + 1], "stop", seconds)
        if p.stop:
            text = ""
            for j in range(len(row)):
                text = self.tok.decode(row[: j + 1])
                if any(s in text for s in p.stop):
                    return Generated(row[: j + 1], "stop", seconds)
        return Generated(row, "length" if len(row) >= p.max_new_tokens else "stop", seconds)

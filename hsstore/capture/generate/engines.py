"""The engines that generate replies: the target in this process (transformers ``generate``, prompts batched
left-padded under a token budget) and an OpenAI-compatible server (hsstore.capture.generate.engines).

An engine takes prompts as token ids and returns, per prompt, the generated ids (with the end-of-turn token
when the reply stopped there), why it ended ("stop" or "length") and the wall time of its batch.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsstore.core.errors import BadInput


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


def generate_attention(device: Any) -> Any:
    """The context ``generate`` runs in: on a GPU, every SDPA kernel but cuDNN's. cuDNN's attention builds a
    plan for each new shape, and decoding makes a new one every step (the keys grow by one token), so each
    batch's first generation took 3x its second on an H100 (21.8 s against 7.1 s, docs/notes/regen-gap.md),
    and a build generates each batch once. The flash and memory-efficient kernels take any length: without
    cuDNN the first generation took what the second did, and the second no longer."""
    import contextlib

    if getattr(device, "type", str(device)) != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def reply_seed(seed: int, prompt: Sequence[int], index: int) -> int:
    """The seed of one sampled reply: of the build's seed, the prompt's tokens and the reply's index."""
    import numpy as np
    import xxhash

    return xxhash.xxh64_intdigest(np.asarray(prompt, dtype=np.int64).tobytes(), seed=seed + index) >> 1


def row_sampler(seeds: list[int], p: Any) -> Any:
    """A transformers logits processor drawing each batch row's next token from its own generator: the scores,
    warped as generate's sampling warps them (temperature, top-k, top-p: transformers applies its own warpers after
    any processor given), become one-hot at the row's draw, which the warpers and generate's draw then keep."""
    import torch
    from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = [TemperatureLogitsWarper(p.temperature)]
    warpers += [TopKLogitsWarper(p.top_k)] if p.top_k else []
    warpers += [TopPLogitsWarper(p.top_p)] if p.top_p < 1.0 else []
    gens = [torch.Generator().manual_seed(s) for s in seeds]

    class RowSampler(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            for w in warpers:
                scores = w(input_ids, scores)
            probs = torch.softmax(scores.float(), dim=-1).cpu()
            out = torch.full_like(scores, float("-inf"))
            for b, g in enumerate(gens):
                out[b, int(torch.multinomial(probs[b], 1, generator=g))] = 0.0
            return out

    return RowSampler()


class LocalEngine:
    """The target itself, in this process: ``model`` (loaded by ModelSpec.load on the build's first device
    and dtype) generates batches of left-padded prompts."""

    name = "model"

    def __init__(self, model: Any, tok: Any, pad_id: int, token_budget: int) -> None:
        from hsstore.capture.model.kernels import DECODE_FAMILIES, FAMILIES, bound_kernels, device_type

        self.model, self.tok, self.pad_id, self.token_budget = model, tok, pad_id, token_budget
        self.eos = end_ids(tok)
        # what generate calls in this process (fla or its torch fallback, for the prompt's forward and for each
        # decoding step; the attention), as a capture records its own: the replies are the data, and a kernel
        # can change which token greedy decoding picks
        self.kernels = bound_kernels(model, families={**FAMILIES, **DECODE_FAMILIES})
        if device_type(model) == "cuda" and self.kernels.get("attention") == "sdpa":
            self.kernels["sdpa_backends"] = "flash,efficient,math"  # generate_attention: no cuDNN

    @property
    def version(self) -> str:
        import torch
        import transformers

        return f"transformers {transformers.__version__}, torch {torch.__version__}"

    def run(
        self,
        prompts: list[list[int]],
        indices: list[int],
        params: Any,
        on_batch: Callable[[list[int], list[Generated]], None],
    ) -> None:
        """Generate every prompt, ``on_batch(positions, replies)`` after each batch (a checkpoint). A sampled
        reply draws from a generator of its own, seeded by ``params.seed``, its prompt and its index: it does not
        depend on the batch it was made in (another token budget, ``--limit``, a resume after a kill); greedy
        needs no seed."""
        for b in prompt_batches([len(p) for p in prompts], params.max_new_tokens, self.token_budget):
            seeds = [reply_seed(params.seed, prompts[i], indices[i]) for i in b]
            on_batch(b, self.batch([prompts[i] for i in b], params, seeds))

    def batch(self, prompts: list[list[int]], p: Any, seeds: list[int]) -> list[Generated]:
        import torch

        width = max(len(x) for x in prompts)
        dev = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, x in enumerate(prompts):  # left-padded: every prompt ends where generation starts
            ids[r, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[r, width - len(x) :] = 1
        kw = self.kwargs(p)
        if p.temperature > 0:
            kw["logits_processor"] = [row_sampler(seeds, p)]
        t0 = time.perf_counter()
        with torch.inference_mode(), generate_attention(dev):
            out = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), **kw)
        seconds = time.perf_counter() - t0
        return [self._cut(row[width:].tolist(), p, seconds) for row in out.cpu()]

    def kwargs(self, p: Any) -> dict[str, Any]:
        """transformers ``generate`` arguments of the sampling parameters ``p`` (temperature 0: greedy)."""
        kw: dict[str, Any] = {
            "max_new_tokens": p.max_new_tokens,
            "eos_token_id": self.eos,
            "pad_token_id": self.pad_id,
            "min_new_tokens": 0,
        }
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


# --- The server engine: an OpenAI-compatible server (``transformers serve``, vLLM, SGLang) generates the replies.

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the given URL only, never a proxy


def _call(url: str, body: dict[str, Any] | None, timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=timeout) as r:
        answer = json.loads(r.read().decode())
        if not isinstance(answer, dict):
            raise ValueError(f"the answer is a JSON {type(answer).__name__}, not an object: {str(answer)[:200]}")
        return answer, {k.lower(): v for k, v in r.headers.items()}  # (header names are case-insensitive)


def served_names(model_path: str) -> set[str]:
    """The names a server may serve the manifest's model under: its path, resolved path or folder name."""
    p = Path(model_path)
    return {model_path, str(p.resolve()), p.name}


def check_served(g: Any, model_path: str) -> tuple[str, str]:
    """The served model's id (BadInput unless it is the manifest's: its name, and its fingerprint where the
    server lists one) and the server's name and version."""
    url = g.url
    try:
        listing, headers = _call(f"{url}/models", None, g.timeout_s)
    except (OSError, ValueError) as e:
        raise BadInput(
            f"[generate] url {url!r}: the server did not answer GET /models ({e}); start an "
            "OpenAI-compatible server there serving the manifest's model"
        ) from None
    data = listing.get("data", [])
    models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    mine = [m for m in models if m.get("id", "") in served_names(model_path)]
    if not mine:
        raise BadInput(
            f"[generate] the server at {url} serves {[m.get('id') for m in models]}, not the manifest's "
            f"model {model_path!r}; serve that model there (or set [model] path to the model it serves)"
        )
    return mine[0]["id"], headers.get("server", "openai-compatible server")


def _first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    """The first choice of a completions answer; ValueError when the answer is not shaped as one."""
    choices = answer.get("choices")
    if (
        not isinstance(choices, list)
        or not choices
        or not isinstance(choices[0], dict)
        or not isinstance(choices[0].get("text", ""), (str, type(None)))
    ):
        raise ValueError(f"not a completions answer (choices[0] an object with a text): {str(answer)[:200]}")
    return choices[0]


class ServerEngine:
    name = "openai"

    def __init__(self, g: Any, tok: Any, model_path: str) -> None:
        self.g, self.tok, self.url = g, tok, g.url
        self.kernels: dict[str, str] = {}  # a server's kernels are not known here (its version names the server)
        self.eos = end_ids(tok)
        self.model, server = check_served(g, model_path)
        self.version = server

    def run(
        self,
        prompts: list[list[int]],
        indices: list[int],
        params: Any,
        on_batch: Callable[[list[int], list[Generated]], None],
    ) -> None:
        """All prompts, ``concurrency`` in flight; a checkpoint per ``concurrency`` replies, in order."""
        step = max(1, params.concurrency)
        with ThreadPoolExecutor(step) as pool:
            for lo in range(0, len(prompts), step):
                batch = list(range(lo, min(lo + step, len(prompts))))
                on_batch(batch, list(pool.map(lambda i: self._one(prompts[i], indices[i], params), batch)))

    def _one(self, prompt: list[int], index: int, p: Any) -> Generated:
        body = {
            "model": self.model,
            "prompt": self.tok.decode(prompt),
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed + index,
            "n": 1,
        }
        if p.top_k:
            body["top_k"] = p.top_k
        if p.stop:
            body["stop"] = list(p.stop)
        t0, error = time.perf_counter(), ""
        for attempt in range(p.retries + 1):
            try:
                out, _ = _call(f"{self.url}/completions", body, p.timeout_s)
                return self._reply(_first_choice(out), time.perf_counter() - t0)
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}: {e.read()[:200]!r}"
                if e.code < 500 and e.code != 429:
                    break
            except (OSError, ValueError, KeyError, IndexError) as e:
                error = f"{type(e).__name__}: {e}"
            time.sleep(min(8.0, 0.5 * 2**attempt))
        return Generated([], "error", time.perf_counter() - t0, f"{error} (after {p.retries + 1} attempt(s))")

    def _reply(self, choice: dict[str, Any], seconds: float) -> Generated:
        """The reply's text tokenized; a reply that stopped ends with the end-of-turn token, as in the data."""
        ids = list(self.tok(choice.get("text") or "", add_special_tokens=False)["input_ids"])
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if finish == "stop" and self.eos and (not ids or ids[-1] not in self.eos):
            ids.append(self.eos[-1] if len(self.eos) > 1 else self.eos[0])
        return Generated(ids, finish, seconds)

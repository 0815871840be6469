"""The server engine: an OpenAI-compatible server (``transformers serve``, vLLM, SGLang) generates the replies.

Prompts are rendered and tokenized here (the same prompts as the in-process engine) and sent as text to
``<url>/completions`` (no chat template on the server's side), ``concurrency`` requests at a time, each with
a timeout and ``retries`` more attempts on a connection error, a timeout or a 5xx/429 answer (backing off);
a request that still fails is a reply with an error, whose row is dropped and named. Before any prompt, the
server's ``<url>/models`` must list the manifest's model (its path, or its folder's name); another model is
refused (BadInput, exit 2) before the store is made. (No server this was tested with lists a fingerprint of
the weights, so none is compared.) Nothing is sent anywhere but
``url``: no proxy from the environment is used.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hsstore.capture.generate.engines import Generated, end_ids
from hsstore.core.errors import BadInput

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the given URL only, never a proxy


def _call(url: str, body: dict[str, Any] | None, timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=timeout) as r:
        return json.loads(r.read().decode()), dict(r.headers)


def served_names(model_path: str) -> set[str]:
    """The names a server may serve the manifest's model under: its path, resolved path or folder name."""
    p = Path(model_path)
    return {model_path, str(p.resolve()), p.name}


def check_served(g: Any, model_path: str) -> tuple[str, str]:
    """The served model's id (BadInput unless it is the manifest's: its name, and its fingerprint where the
    server lists one) and the server's name and version."""
    url = g.url.rstrip("/")
    try:
        listing, headers = _call(f"{url}/models", None, g.timeout_s)
    except (OSError, ValueError) as e:
        raise BadInput(f"[generate] url {url!r}: the server did not answer GET /models ({e}); start an "
                       "OpenAI-compatible server there serving the manifest's model") from None
    models = [m for m in listing.get("data", []) if isinstance(m, dict)]
    mine = [m for m in models if m.get("id", "") in served_names(model_path)]
    if not mine:
        raise BadInput(f"[generate] the server at {url} serves {[m.get('id') for m in models]}, not the manifest's "
                       f"model {model_path!r}; serve that model there (or set [model] path to the model it serves)")
    return mine[0]["id"], headers.get("server", "openai-compatible server")


class ServerEngine:
    name = "openai"

    def __init__(self, g: Any, tok: Any, model_path: str) -> None:
        self.g, self.tok, self.url = g, tok, g.url.rstrip("/")
        self.eos = end_ids(tok)
        self.model, server = check_served(g, model_path)
        self.version = server

    def run(self, prompts: list[list[int]], indices: list[int], params: Any,
            on_batch: Callable[[list[int], list[Generated]], None]) -> None:
        """All prompts, ``concurrency`` in flight; a checkpoint per ``concurrency`` replies, in order."""
        step = max(1, params.concurrency)
        with ThreadPoolExecutor(step) as pool:
            for lo in range(0, len(prompts), step):
                batch = list(range(lo, min(lo + step, len(prompts))))
                on_batch(batch, list(pool.map(lambda i: self._one(prompts[i], indices[i], params), batch)))

    def _one(self, prompt: list[int], index: int, p: Any) -> Generated:
        body = {"model": self.model, "prompt": self.tok.decode(prompt), "max_tokens": p.max_new_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "seed": p.seed + index, "n": 1}
        if p.top_k:
            body["top_k"] = p.top_k
        if p.stop:
            body["stop"] = list(p.stop)
        t0, error = time.perf_counter(), ""
        for attempt in range(p.retries + 1):
            try:
                out, _ = _call(f"{self.url}/completions", body, p.timeout_s)
                return self._reply(out["choices"][0], time.perf_counter() - t0)
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}: {e.read()[:200]!r}"
                if e.code < 500 and e.code != 429:
                    break
            except (OSError, ValueError, KeyError, IndexError) as e:
                error = f"{type(e).__name__}: {e}"
            time.sleep(min(8.0, 0.5 * 2 ** attempt))
        return Generated([], "error", time.perf_counter() - t0, f"{error} (after {p.retries + 1} attempt(s))")

    def _reply(self, choice: dict[str, Any], seconds: float) -> Generated:
        """The reply's text tokenized; a reply that stopped ends with the end-of-turn token, as in the data."""
        ids = list(self.tok(choice.get("text") or "", add_special_tokens=False)["input_ids"])
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if finish == "stop" and self.eos and (not ids or ids[-1] not in self.eos):
            ids.append(self.eos[-1] if len(self.eos) > 1 else self.eos[0])
        return Generated(ids, finish, seconds)

"""Every generated reply, in the store's build lineage (JSON lines, no pickle).

``builds/<build_id>/gen-<config>-<n>.jsonl``: the replies one batch generated, written atomically as the batch
ends, before any state is captured; a killed build's replies are found there by the next run of the same
configuration (``config``: a fingerprint of the model, tokenizer, engine and sampling parameters), which
generates only what is missing. ``builds/<build_id>/ledger.jsonl``: one record per reply the build used,
whichever build generated it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hsstore.core.schema.record import Record
from hsstore.storage import layout

GEN_FILE = re.compile(r"^gen-([0-9a-f]{16})-([0-9]{1,9})\.jsonl$")


class Reply(Record):
    """One generated reply and how it was made."""

    key: str  # the prompt's generation key (config, prompt tokens, reply index)
    ids: list[int]  # the generated token ids (with the end-of-turn token when it stopped there)
    finish_reason: str  # "stop" (an end-of-turn token or a stop string) or "length" (cut at max_new_tokens)
    prompt_tokens: int
    seconds: float  # the batch's (or the request's) wall time, shared by its replies
    engine: str
    engine_version: str
    model: str  # the model's identity fingerprint (or name) the reply came from
    sampling: dict[str, Any]
    seed: int
    at: str
    build_id: str = ""  # the build that generated it
    error: str | None = None  # a server error after the retries (ids empty)




def checkpoint_key(build_id: str, config: str, n: int) -> str:
    return layout.generations_key(build_id, config, n)


def ledger_key(build_id: str) -> str:
    return layout.ledger_key(build_id)


def load_replies(store: Any, config: str) -> dict[str, Reply]:
    """Every reply of configuration ``config`` any build of ``store`` checkpointed (errors left out: they are
    tried again)."""
    out: dict[str, Reply] = {}
    for key in sorted(store.io.list("builds/")):
        m = GEN_FILE.match(key.rsplit("/", 1)[-1])
        if not m or m.group(1) != config[:16]:
            continue
        raw = store.io.get(key)
        for line in (raw or b"").decode().splitlines():
            r = Reply.from_json(line.encode(), key)
            if r.error is None:
                out.setdefault(r.key, r)
    return out


def put_batch(store: Any, build_id: str, config: str, n: int, replies: list[Reply]) -> None:
    """One batch's replies, atomically (a batch is either all there or not at all)."""
    data = "".join(json.dumps(r.to_dict()) + "\n" for r in replies).encode()
    store.io.put_atomic(checkpoint_key(build_id, config, n), data)


def put_ledger(store: Any, build_id: str, records: list[dict[str, Any]]) -> None:
    store.io.put_if_absent(ledger_key(build_id), "".join(json.dumps(r) + "\n" for r in records).encode())

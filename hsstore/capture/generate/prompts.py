"""Rows as prompts, and regenerated replies as samples.

A chat row (ShareGPT or OpenAI messages; a ``{"prompt": ...}`` row is one user message) gives the turns to
regenerate: ``turns = "last"`` its last assistant turn (a row without one is a prompt, its reply appended),
``"all"`` each assistant turn in order, later ones conditioned on the regenerated earlier ones. A prompt is
the chat template's rendering of the messages before the turn with the generation prompt, tokenized.

``turns = "last"``: the sample is the prompt's tokens followed by the generated tokens exactly, the loss mask
over the generated tokens (with the end-of-turn token where the reply stopped there); ``reasoning = "drop"``
keeps a reply's leading reasoning (up to ``</think>``) in the sequence but out of the mask. ``turns = "all"``:
the last turn's prompt, as the target saw it (the earlier replies rendered by the chat template from their
text), then the last reply's tokens exactly; an earlier reply keeps its mask only where the template's tokens
are the generated ones, its end token only where it is the one the target emitted (``all_turns_sample``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hsstore.capture.inputs.datafiles import BadRow
from hsstore.capture.inputs.messages import THINK_CLOSE, RowRejected, to_chat
from hsstore.capture.inputs.tokenizing import detect_format

if TYPE_CHECKING:
    from hsstore.capture.inputs.lossmask import ChatMasker


@dataclass
class Job:
    """One chain of regenerated replies of one row (``index``: which of its ``n`` replies)."""

    file: str
    row: int
    msgs: list[dict[str, Any]]
    tools: Any
    turns: list[int]  # positions in ``msgs`` of the assistant turns to regenerate (len(msgs): append one)
    index: int
    replies: list[Any] = field(default_factory=list)  # ledger.Reply per regenerated turn, in order
    texts: list[str] = field(default_factory=list)  # the replies' text, as later turns see them
    prompt: list[int] = field(default_factory=list)  # the current turn's prompt tokens
    dropped: tuple[str, str] | None = None  # (reason, detail)


def chat_of(row: Any, fmt: str) -> tuple[list[dict[str, Any]], Any]:
    """A row's messages and tools; RowRejected for a row that holds no prompt."""
    if isinstance(row, BadRow):
        raise RowRejected(row.reason, row.detail)
    if not isinstance(row, dict):
        raise RowRejected("row is not a JSON object")
    f = detect_format(row) if fmt == "auto" else fmt
    if f in ("sharegpt", "openai"):
        chat = to_chat(row, "conversations" if f == "sharegpt" else "messages", prompts=True)
        return chat.messages, chat.tools
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return [{"role": "user", "content": row["prompt"]}], None
    raise RowRejected("no prompt to regenerate from", "needs conversations, messages or a prompt field")


def jobs_of(file: str, n: int, row: Any, fmt: str, turns: str, replies: int) -> list[Job]:
    msgs, tools = chat_of(row, fmt)
    at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    append = [len(msgs)] if msgs[-1]["role"] != "assistant" else []  # a prompt: its reply is appended
    todo = at + append if turns == "all" else (append or at[-1:])
    return [Job(file, n, msgs, tools, list(todo), i) for i in range(replies)]


def turn_messages(job: Job) -> list[dict[str, Any]]:
    """The messages before the job's next turn, earlier turns replaced by their regenerated text."""
    k = len(job.replies)
    msgs = [dict(m) for m in job.msgs[: job.turns[k]]]
    for t, text in zip(job.turns[:k], job.texts):
        msgs[t] = {"role": "assistant", "content": text}
    return msgs


def reasoning_end(tok: Any, ids: list[int]) -> int:
    """How many leading tokens of a reply are its reasoning (up to and with ``</think>``; 0 if it has none)."""
    if THINK_CLOSE not in tok.decode(ids):
        return 0
    lo, hi = 1, len(ids)
    while lo < hi:  # the shortest prefix whose text holds the closing tag
        mid = (lo + hi) // 2
        if THINK_CLOSE in tok.decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def reply_text(tok: Any, ids: list[int], eos: list[int], drop_reasoning: bool) -> str:
    """A reply's text as later turns see it (its end token left out; reasoning too with ``drop``)."""
    body = ids[:-1] if ids and ids[-1] in eos else ids
    if drop_reasoning:
        body = body[reasoning_end(tok, body) :]
    text: str = tok.decode(body, skip_special_tokens=True)
    return text.lstrip() if drop_reasoning else text


def last_turn_sample(tok: Any, job: Job, eos: list[int], drop_reasoning: bool) -> tuple[list[int], list[int]]:
    """The prompt's tokens then the generated ones exactly; the mask over the generated ones."""
    reply = job.replies[-1].ids
    if not [t for t in reply if t not in eos]:
        raise RowRejected("empty reply", f"the target ended the reply at once ({len(reply)} token(s))")
    mask = [1] * len(reply)
    if drop_reasoning:
        mask[: reasoning_end(tok, reply)] = [0] * reasoning_end(tok, reply)
    return list(job.prompt) + list(reply), [0] * len(job.prompt) + mask


def all_turns_sample(masker: ChatMasker, job: Job, eos: list[int], drop_reasoning: bool) -> tuple[list[int], list[int]]:
    """The last turn's prompt, as the target saw it when it generated the last reply (the earlier replies as
    their text renders in the chat template, each masked), then the last reply's tokens exactly, masked as
    ``last_turn_sample`` masks them: never a re-tokenized reply, or an end-of-turn token the target did not emit."""
    if any(not t.strip() for t in job.texts):
        raise RowRejected("empty reply", "a regenerated turn has no text")
    ids, mask = last_turn_sample(masker.tok, job, eos, drop_reasoning)
    if len(job.turns) == 1:
        return ids, mask
    before = [dict(m) for m in job.msgs[: job.turns[-1]]]  # up to the last turn's prompt, earlier replies as text
    for t, text in zip(job.turns[:-1], job.texts[:-1]):
        before[t] = {"role": "assistant", "content": text}
    context, context_mask = masker(before, job.tools, [i in job.turns[:-1] for i in range(len(before))])
    if list(job.prompt[: len(context)]) != list(context):
        raise RowRejected(
            "chat template renders a prompt unlike its conversation",
            "the last turn's prompt does not begin with the conversation before it as rendered: "
            "the earlier replies' masks cannot be placed",
        )
    n = len(job.prompt)
    return ids, _exact_only(context, list(context_mask), job, eos) + [0] * (n - len(context)) + mask[n:]


def _exact_only(context: list[int], mask: list[int], job: Job, eos: list[int]) -> list[int]:
    """``mask`` over the earlier replies in ``context`` (one masked run each, in order), kept only on tokens the
    target generated: a run whose reply text did not come back as the generated tokens (bytes that are not UTF-8,
    a tokenization the tokenizer would not choose, reasoning dropped) is context only, and the end-of-turn token
    the template closes a reply with stays unmasked where the target did not emit one (cut at max_new_tokens)."""
    runs, start = [], None
    for i, b in enumerate([*mask, 0]):
        if b and start is None:
            start = i
        elif not b and start is not None:
            runs.append((start, i))
            start = None
    if len(runs) != len(job.replies) - 1:  # (the template merged or split replies: nothing can be told apart)
        return [0] * len(mask)
    out = list(mask)
    for (a, b), reply in zip(runs, job.replies[:-1]):
        body = list(reply.ids[:-1]) if reply.ids and reply.ids[-1] in eos else list(reply.ids)
        emitted_end = len(body) < len(reply.ids)
        if context[a : a + len(body)] != body or b - a not in (len(body), len(body) + 1):
            out[a:b] = [0] * (b - a)
        elif b - a == len(body) + 1 and (not emitted_end or context[b - 1] != reply.ids[-1]):
            out[b - 1] = 0  # the template's end token, not the one the target emitted (or none)
    return out

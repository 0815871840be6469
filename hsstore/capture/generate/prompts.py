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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hsstore.capture.inputs.datafiles import BadRow
from hsstore.capture.inputs.messages import THINK_CLOSE, RowRejected, to_chat
from hsstore.capture.inputs.tokenizing import InputReport, InputRow, _fit, _numbered, detect_format
from hsstore.core.errors import BadInput
from hsstore.core.keys import SampleTokens, sample_key

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


def jobs_from_rows(rows: Iterable[InputRow], fmt: str, g: Any, report: InputReport, limit: int | None) -> list[Job]:
    jobs: list[Job] = []
    for file, n, row in _numbered(rows):
        if limit is not None and len({(j.file, j.row) for j in jobs}) >= limit:
            break
        report.rows += 1
        try:
            jobs += jobs_of(file, n, row, fmt, g.turns, g.n)
        except RowRejected as r:
            report.rejected[r.reason] += 1
            report.note("rejected", file, n, r.reason, r.detail)
    return jobs


def prompt_masker(tok: Any, g: Any) -> Any:
    """The ChatMasker that renders a [generate] build's prompts and turns (with its chat_template_kwargs, e.g.
    enable_thinking)."""
    from hsstore.capture.inputs.lossmask import ChatMasker

    masker = ChatMasker(tok)
    masker.kwargs.update(g.chat_template_kwargs)
    return masker


def prompt_tokens(masker: Any, job: Job, max_length: int) -> list[int]:
    """The prompt of the job's next turn, earlier turns as regenerated."""
    return rendered_prompt(masker, turn_messages(job), job.tools, max_length)


def rendered_prompt(masker: Any, msgs: list[dict[str, Any]], tools: Any, max_length: int) -> list[int]:
    """``msgs`` rendered with the generation prompt and tokenized; RowRejected from ``max_length`` tokens on."""
    text = masker._render(msgs, tools, True)
    ids = list(masker.tok(text, add_special_tokens=False)["input_ids"])
    if len(ids) >= max_length:
        raise RowRejected(f"prompt longer than max_length={max_length}", f"{len(ids)} tokens before the reply")
    return ids


def capped_history(tok: Any, job: Job, upto: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """``job.msgs`` before position ``upto`` as a plan stands them for the build's: each earlier turn the build
    regenerates (``turns = "all"``) cut to its first ``max_new_tokens`` tokens, as the target's reply is no longer."""
    out = []
    for k, msg in enumerate(job.msgs[:upto]):
        msg = dict(msg)
        if k in job.turns and isinstance(msg.get("content"), str):
            msg["content"] = tok.decode(tok(msg["content"], add_special_tokens=False)["input_ids"][:max_new_tokens])
        out.append(msg)
    return out


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


def samples_of(
    jobs: list[Job], masker: Any, m: Any, tok_fp: str, eos: list[int], report: InputReport
) -> tuple[list[SampleTokens], list[tuple[Job, str | None]]]:
    """Each job as a sample (deduplicated by key); every job with the key of its sample (None: dropped)."""
    samples: list[SampleTokens] = []
    seen: dict[str, str] = {}
    keyed: list[tuple[Job, str | None]] = []
    for j in jobs:
        key = None
        try:
            if j.dropped is not None:
                raise RowRejected(*j.dropped)
            drop = m.generate.reasoning == "drop"
            ids, mask = (
                last_turn_sample(masker.tok, j, eos, drop)
                if m.generate.turns == "last"
                else all_turns_sample(masker, j, eos, drop)
            )
            ids, mask = _fit(ids, mask, m.max_length, m.too_long, report, j.file, j.row)
            a, b = np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)
            key = sample_key(tok_fp, a, b)
            if key in seen:
                report.duplicates += 1
                report.note("duplicate", j.file, j.row, "duplicate of an earlier row", seen[key])
            else:
                seen[key] = f"{j.file} row {j.row}"
                samples.append(SampleTokens(key, a, b))
                report.usable += 1
        except RowRejected as r:
            report.rejected[r.reason] += 1
            report.note("rejected", j.file, j.row, r.reason, r.detail)
        keyed.append((j, key))
    report.close()
    if not samples:
        reasons = ", ".join(f"{k}: {v}" for k, v in report.rejected.items()) or "no rows"
        raise BadInput(
            f"no usable rows after regenerating the replies ({report.rows} rows read; {reasons}); check "
            "[data] files and [generate]"
        )
    return samples, keyed

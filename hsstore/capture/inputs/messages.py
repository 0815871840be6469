"""Chat rows in the one message shape chat templates read: roles, text content, tool calls, reasoning.

Datasets spell one conversation many ways: ShareGPT ``from``/``value`` with ``human``/``gpt``, OpenAI
``role``/``content`` with content as a list of parts, tool calls and tool results, reasoning in a field of
its own. Each is mapped onto the OpenAI/transformers shape (``role``, ``content``, ``reasoning_content``,
``tool_calls``, ``tool_call_id``, ``name``), with a row's ``system`` field as its first message and
OpenAI's per-message ``weight`` (0: not trained on) kept aside. Nothing is guessed: a row that cannot be
mapped exactly is rejected with a reason; values such as tool-call arguments are passed on as given (a
JSON string stays a string — templates differ in which they expect).

For the loss masks (hsstore.capture.inputs.lossmask): copies of the messages with unique markers around each
text of this shape (content, reasoning, tool-call names and string arguments), and where those markers land
in a rendering.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from hsstore.core.nesting import TooDeep, loads_bounded, lone_surrogate

# lower-cased role names seen in public datasets -> the role chat templates know
ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
    "tool_response": "tool",
}
TOOL_CALL_ROLES = ("function_call", "tool_call", "tool_calls")  # ShareGPT turns that hold an assistant's call(s)
TEXT_PARTS = ("text", "input_text", "output_text")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # distilled reasoning written inline, at the start of a reply


class RowRejected(Exception):
    """A row hsstore will not train on. ``reason`` is stable (it is counted); ``detail`` names the spot."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _text(content: Any, where: str) -> str:
    """A message's content as one string: a string as is, a list of parts joined (text parts only)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RowRejected("content is neither text nor a list of parts", f"{where}: {type(content).__name__}")
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise RowRejected("content part is neither text nor an object", where)
        kind = part.get("type", "text" if "text" in part else None)
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        else:
            raise RowRejected("non-text content part (only text is supported)", f"{where}: type {kind!r}")
    return "".join(out)


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI-shaped tool calls from either ``{"function": {...}}`` or flat ``{"name", "arguments"}`` items."""
    calls = raw if isinstance(raw, list) else [raw]
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowRejected("tool call without a function name", f"{where}, call {j}")
        args = fn.get("arguments", fn.get("parameters", {}))
        if not isinstance(args, (str, dict)):
            raise RowRejected("tool call arguments are neither a JSON string nor an object", f"{where}, call {j}")
        item: dict[str, Any] = {
            "type": call.get("type") or "function",
            "function": {"name": fn["name"], "arguments": args},
        }
        if call.get("id") is not None:
            item["id"] = str(call["id"])
        out.append(item)
    return out


def _parsed_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """A ShareGPT ``function_call`` turn's value (JSON text of one call or a list of calls)."""
    if isinstance(value, str):
        try:
            value = loads_bounded(value)
        except TooDeep as e:
            raise RowRejected("nested too deeply", f"{where}: function_call {e}") from None
        except ValueError:
            raise RowRejected("function_call turn is not JSON", where) from None
        if lone_surrogate(value) is not None:
            raise RowRejected("not Unicode text", f"{where}: a lone surrogate {lone_surrogate(value)} in function_call")
    if not value:
        raise RowRejected("function_call turn holds no call", where)
    return _tool_calls(value, where)


def _message(turn: dict[str, Any], i: int) -> dict[str, Any]:
    raw_role = turn.get("role", turn.get("from"))
    if not isinstance(raw_role, str):
        raise RowRejected("message without a role", f"message {i}")
    name = raw_role.strip().lower()
    content = turn.get("content", turn.get("value"))
    where = f"message {i} ({raw_role})"
    if name in TOOL_CALL_ROLES:
        return {"role": "assistant", "content": "", "tool_calls": _parsed_calls(content, where)}
    role = ROLES.get(name)
    if role is None:
        raise RowRejected("unknown role", f"message {i}: {raw_role!r}")
    msg: dict[str, Any] = {"role": role}
    calls = turn.get("tool_calls") if turn.get("tool_calls") is not None else turn.get("function_call")
    if role == "assistant" and calls is not None:
        msg["tool_calls"] = _tool_calls(calls, where)
    if content is None and msg.get("tool_calls"):
        content = ""  # OpenAI writes content: null beside tool calls; templates expect a string
    if content is None:
        raise RowRejected("message without content", where)
    msg["content"] = _text(content, where)
    if role == "assistant":
        reasoning = next((turn[k] for k in REASONING_KEYS if turn.get(k) is not None), None)
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise RowRejected("reasoning is not text", where)
            msg["reasoning_content"] = reasoning
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if turn.get(key) is not None:
                msg[key] = str(turn[key])
    return msg


def inline_reasoning(content: str) -> tuple[str, str] | None:
    """(reasoning, reply) of assistant content that begins with one ``<think>…</think>`` block, split as
    Qwen3's template splits it (newlines inside the tags and before the reply dropped); None for any
    other content (no block, a block not at the start, or a tag twice)."""
    head = content.lstrip()
    if not head.startswith(THINK_OPEN) or content.count(THINK_OPEN) != 1 or content.count(THINK_CLOSE) != 1:
        return None
    reasoning, found, reply = head[len(THINK_OPEN) :].partition(THINK_CLOSE)
    return (reasoning.strip("\n"), reply.lstrip("\n")) if found else None


def reasoning_moved(msgs: list[dict[str, Any]], bare_only: bool = False) -> list[dict[str, Any]] | None:
    """``msgs`` with each assistant reply's leading ``<think>…</think>`` block moved to ``reasoning_content``
    (as ``inline_reasoning`` splits it; ``bare_only``: only blocks with no text after them, which Qwen3's
    templates render the same either way); None when no reply has such a block."""
    out, moved = [], False
    for m in msgs:
        split = inline_reasoning(m["content"]) if m["role"] == "assistant" and "reasoning_content" not in m else None
        if split is not None and not (bare_only and split[1].strip()):
            m, moved = {**m, "reasoning_content": split[0], "content": split[1]}, True
        out.append(m)
    return out if moved else None


def arguments_hint(msgs: list[dict[str, Any]], raised: Exception) -> str:
    """Where a template raised a TypeError over a row with tool calls: which form the row's arguments take
    (templates differ: some concatenate JSON text, others iterate an object), so the fix is named."""
    forms = {type(c["function"]["arguments"]).__name__ for m in msgs for c in m.get("tool_calls") or ()}
    if not isinstance(raised, TypeError) or not forms:
        return ""
    given = "JSON text" if forms == {"str"} else "objects" if forms == {"dict"} else "both JSON text and objects"
    want = "objects" if forms == {"str"} else "JSON text" if forms == {"dict"} else "one form"
    return f" (this row's tool-call arguments are {given}; this template may want {want})"


def _trained(turn: dict[str, Any], role: str, i: int) -> bool:
    """OpenAI fine-tuning's ``weight``: 0 keeps an assistant turn in the prompt but out of the loss."""
    weight = turn.get("weight")
    if weight is None:
        return role == "assistant"
    if role != "assistant":
        raise RowRejected("weight on a message that is not the assistant's", f"message {i}")
    if type(weight) is not int or weight not in (0, 1):
        raise RowRejected("weight is neither 0 nor 1", f"message {i}: {weight!r}")
    return weight == 1


@dataclass(frozen=True)
class Chat:
    """A normalized conversation: the messages the template renders, which assistant turns are trained on
    (``trained[i]``, False for every other role), and the row's tool schemas."""

    messages: list[dict[str, Any]]
    trained: list[bool]
    tools: list[dict[str, Any]] | None
    empty_replies: tuple[int, ...] = ()  # trained assistant turns with no text, tool call or reasoning

    @classmethod
    def checked(cls, msgs: list[dict[str, Any]], trained: list[bool], tools: Any) -> Chat:
        """The chat, its empty trained replies named; RowRejected when every trained reply is empty: such a
        row would train only the end-of-turn token after the prompt (an empty reply in a row that has
        others trains that one token and is kept, counted and named in the build's rows report)."""
        empty = tuple(
            i
            for i, (m, t) in enumerate(zip(msgs, trained))
            if t
            and not m["content"].strip()
            and not m.get("tool_calls")
            and not str(m.get("reasoning_content") or "").strip()
        )
        if empty and len(empty) == sum(trained):
            raise RowRejected(
                "empty assistant reply",
                f"message(s) {', '.join(map(str, empty))}: only the end-of-turn token would train",
            )
        return cls(msgs, trained, tools, empty)


def to_chat(row: dict[str, Any], key: str, prompts: bool = False) -> Chat:
    """The conversation under ``row[key]`` (with the row's ``system`` and ``tools`` fields); RowRejected if
    it cannot be mapped exactly. ``prompts``: a conversation without an assistant turn is taken (a prompt to
    regenerate a reply for)."""
    turns = row.get(key)
    if not isinstance(turns, list):
        raise RowRejected("malformed chat", "messages are not a list")
    msgs, trained = [], []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RowRejected("malformed chat", f"message {i} is not an object")
        msgs.append(_message(turn, i))
        trained.append(_trained(turn, msgs[-1]["role"], i))
    system = row.get("system")
    if system not in (None, ""):  # LLaMA-Factory's ShareGPT layout: the system prompt as a field of the row
        if not isinstance(system, str):
            raise RowRejected("system is not text")
        if msgs and msgs[0]["role"] == "system":
            raise RowRejected("a system prompt both as the row's field and as its first message")
        msgs.insert(0, {"role": "system", "content": system})
        trained.insert(0, False)
    if not msgs or all(not m["content"].strip() and not m.get("tool_calls") for m in msgs):
        raise RowRejected("empty")
    if not prompts and not any(m["role"] == "assistant" for m in msgs):
        raise RowRejected("no assistant turn")
    return Chat.checked(msgs, trained, row_tools(row))


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's tool schemas (``tools``, a list or its JSON text), passed to the template as ``tools``."""
    tools = row.get("tools")
    if tools is None or tools == "":
        return None
    if isinstance(tools, str):
        try:
            tools = loads_bounded(tools)
        except TooDeep as e:
            raise RowRejected("nested too deeply", f"tools {e}") from None
        except ValueError:
            raise RowRejected("tools is not JSON") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowRejected("tools is not a list of objects")
    if lone_surrogate(tools) is not None:
        raise RowRejected("not Unicode text", f"a lone surrogate {lone_surrogate(tools)} in tools")
    return tools or None


# --- Unique markers around each message's text, and where they land in a rendering (for the loss masks of
# hsstore.capture.inputs.lossmask: which texts of a message are marked is this module's message shape).

PLACEMENTS = (("all", "edges"), ("all", "inner"), ("assistant", "inner"))  # tried in order


@dataclass(frozen=True)
class Marked:
    """A marked rendering mapped onto the plain one: where each message's markers land in plain text."""

    text: str
    starts: list[int]  # marked-text start of each marker, in order
    removed: list[int]  # marker characters before marker j (removed[j]); removed[-1] = all of them
    where: dict[int, list[int]]  # message index -> plain positions of its markers
    placement: tuple[str, str]  # (who, how) of PLACEMENTS that produced it

    def plain_pos(self, pos: int) -> int:
        """Plain position of a marked position that lies outside markers."""
        return pos - self.removed[bisect_left(self.starts, pos)]


def mark(text: str, start: str, end: str, how: str) -> str:
    """``text`` between ``start`` and ``end`` (``how``: "edges" or "inner"); blank text is left unmarked."""
    if not text.strip():
        return text
    if how == "edges":
        return start + text + end
    lead, trail = len(text) - len(text.lstrip()), len(text.rstrip())
    return text[:lead] + start + text[lead:trail] + end + text[trail:]


def marked_messages(msgs: list[dict[str, Any]], nonce: str, who: str, how: str) -> list[dict[str, Any]]:
    """Copies of ``msgs`` with markers around the texts of ``who`` ("all" or "assistant")."""
    out = []
    for i, m in enumerate(msgs):
        m = dict(m)
        if who == "all" or m["role"] == "assistant":

            def tag(part: int, end: bool, i: int = i) -> str:
                return f"@{nonce}{i}.{part}{'E' if end else 'S'}@"

            m["content"] = mark(m["content"], tag(0, False), tag(0, True), how)
            if "reasoning_content" in m:
                m["reasoning_content"] = mark(m["reasoning_content"], tag(1, False), tag(1, True), how)
            calls = []
            for j, c in enumerate(m.get("tool_calls", ())):
                fn = dict(c["function"])
                fn["name"] = mark(fn["name"], tag(2 + 2 * j, False), tag(2 + 2 * j, True), "edges")
                if isinstance(fn["arguments"], str):
                    fn["arguments"] = mark(fn["arguments"], tag(3 + 2 * j, False), tag(3 + 2 * j, True), how)
                calls.append({**c, "function": fn})
            if calls:
                m["tool_calls"] = calls
        out.append(m)
    return out


def read_markers(text: str, nonce: str, plain: str, placement: tuple[str, str]) -> Marked | None:
    """Where the markers of ``text`` land in ``plain``; None unless removing them gives ``plain`` and each
    marker occurs once (a template that repeats or alters a message's text hides where it is)."""
    pattern = re.compile(rf"@{nonce}(\d+)\.(\d+)([SE])@")
    found = list(pattern.finditer(text))
    if pattern.sub("", text) != plain or len({m.group() for m in found}) != len(found):
        return None
    starts: list[int] = []
    removed: list[int] = []
    where: dict[int, list[int]] = {}
    total = 0
    for m in found:
        starts.append(m.start())
        removed.append(total)
        where.setdefault(int(m.group(1)), []).append(m.start() - total)
        total += len(m.group())
    removed.append(total)
    return Marked(text, starts, removed, where, placement)


def repeated_message(text: str, nonce: str) -> int | None:
    """The first message whose marker occurs more than once in ``text`` (the template writes its text twice)."""
    seen: set[str] = set()
    for m in re.finditer(rf"@{nonce}(\d+)\.(\d+)([SE])@", text):
        if m.group() in seen:
            return int(m.group(1))
        seen.add(m.group())
    return None

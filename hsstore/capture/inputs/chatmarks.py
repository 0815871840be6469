"""Unique markers around each message's text, and where they land in a rendering (hsstore.capture.inputs.lossmask).

Markers are ``@<nonce><message>.<part><S|E>@``: part 0 is the content, 1 the reasoning, 2 + 2j and 3 + 2j a tool
call's name and string arguments. A placement says whose text is marked (every message's or only the replies')
and how (around the whole text, or inside its leading and trailing whitespace, which templates often strip).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

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
    starts, removed, where, total = [], [], {}, 0
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

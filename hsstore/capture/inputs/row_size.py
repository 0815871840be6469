"""A row's text is bounded before it is tokenized: tokenizing costs ~250 bytes of memory per character (a
20 MB JSON line took 5 GB and 45 s; a parquet cell of repeated text is kilobytes on disk), and only a row's
first ``max_length`` tokens are ever kept.

No token of the tokenizer spans more than ``longest`` characters (its longest vocabulary entry), so a string
of ``c`` characters is at least ``c / longest`` tokens. A string longer than twice what ``max_length`` tokens
can span is cut there before tokenizing: the tokens kept are those of the whole string (a word-splitting
tokenizer — every byte-level BPE — tokenizes the text before the cut the same way), and the row is reported
truncated (or, with ``too_long = "skip"``, too long) as before, its length as "at least N tokens". A row
whose strings, each cut, still total more than ``ROW_STRINGS`` such strings is rejected ("too large to
tokenize") without being tokenized; so is a chat of more than ``turn_cap`` messages (every message renders
at least its role's header, so such a chat is far past ``max_length``; the masker's time grows with the
square of the turns: 10,000 two-letter turns took 214 s for one row). A cut string that makes no more than
``max_length`` tokens on its own (a tokenizer whose tokens span more than its vocabulary shows) rejects its
row ("too large to tokenize"): its kept tokens might not be the whole text's.
"""

from __future__ import annotations

from typing import Any

MARGIN = 2  # a cut string spans twice max_length tokens: the text near the cut never reaches the kept tokens
ROW_STRINGS = 8  # a row may hold this many cut-size strings in all (a chat of many long turns)
UNKNOWN_LONGEST = 1024  # characters per token assumed of a tokenizer that cannot list its vocabulary


def longest_token(tok: Any) -> int:
    """Characters of the tokenizer's longest vocabulary entry (added and special tokens included)."""
    try:
        vocab = tok.get_vocab()
        return max((len(t) for t in vocab if isinstance(t, str)), default=1) or 1
    except Exception:  # a tokenizer without get_vocab: assume long tokens (a looser, still bounded, cut)
        return UNKNOWN_LONGEST


def string_cap(tok: Any, max_length: int) -> int:
    """Characters a string of a row is cut to before tokenizing, for rows kept to ``max_length`` tokens."""
    return MARGIN * (max_length + 16) * longest_token(tok)


def clip_strings(value: Any, cap: int) -> tuple[Any, int, bool]:
    """``value`` (a parsed row) with every string longer than ``cap`` characters cut to ``cap``; the total
    characters of its strings after the cut; whether any string was cut."""
    if isinstance(value, str):
        return (value[:cap], cap, True) if len(value) > cap else (value, len(value), False)
    if isinstance(value, dict):
        out, total, cut = {}, 0, False
        for k, v in value.items():
            out[k], n, c = clip_strings(v, cap)
            total, cut = total + n, cut or c
        return out, total, cut
    if isinstance(value, (list, tuple)):
        items = [clip_strings(v, cap) for v in value]
        return [i[0] for i in items], sum(i[1] for i in items), any(i[2] for i in items)
    return value, 0, False


def long_strings(value: Any, cap: int) -> list[str]:
    """The strings of ``value`` (a parsed row, already cut) of ``cap`` characters or more: the cut ones."""
    if isinstance(value, str):
        return [value] if len(value) >= cap else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [s for v in items for s in long_strings(v, cap)]


def check_cut(tok: Any, row: Any, cap: int, max_length: int) -> str | None:
    """Why cutting ``row``'s strings at ``cap`` could change the tokens kept (None: it cannot). Sound only
    where a cut string still makes more than ``max_length`` tokens; a tokenizer one of whose tokens spans
    more characters than its vocabulary shows (a WordPiece ``[UNK]`` is a whole unknown word) may not."""
    for text in long_strings(row, cap):
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        if n <= max_length:
            return (f"a string cut to {cap:,} characters makes only {n} tokens (max_length={max_length}): this "
                    "tokenizer's tokens span more characters than its vocabulary's entries, so the cut could "
                    "change the tokens kept")
    return None


def turn_cap(max_length: int) -> int:
    """Messages a chat row may hold to be tokenized for rows kept to ``max_length`` tokens."""
    return MARGIN * (max_length + 16)

"""Input rows -> token samples: format detection, tokenization, loss masks, and a report naming every row
that was not taken as it was.

Formats, detected per row: ShareGPT (``conversations``), OpenAI (``messages``), plain ``text``, ``prompt`` +
``completion``. Loss mask: each assistant reply with its end-of-turn token for chats (hsstore.capture.inputs.lossmask),
completion tokens for prompt/completion, all tokens for text. Rejected, duplicate and truncated rows are
counted by reason and named (file, row, reason) in ``InputReport.issues``; nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from hsstore.capture.inputs.datafiles import BadRow, load_rows
from hsstore.capture.inputs.lossmask import ChatMasker
from hsstore.capture.inputs.messages import RowRejected, to_chat
from hsstore.capture.inputs.row_report import InputReport
from hsstore.capture.inputs.row_size import ROW_STRINGS, check_cut, clip_strings, string_cap, turn_cap
from hsstore.core.errors import BadInput
from hsstore.core.keys import SampleTokens, sample_key
from hsstore.core.schema.manifest import DATA_FORMATS as FORMATS

__all__ = ["InputReport", "detect_format", "load_rows", "tokenize_rows"]
UNKNOWN = "unknown format (no conversations/messages/text/prompt+completion)"


def detect_format(row: dict[str, Any]) -> str | None:
    # files that mix formats get every column, with None where a row lacks it
    if row.get("conversations") is not None:
        return "sharegpt"
    if row.get("messages") is not None:
        return "openai"
    if row.get("prompt") is not None and row.get("completion") is not None:
        return "prompt_completion"
    if row.get("text") is not None:
        return "text"
    return None


class _Tokens:
    """Turns one row into (input_ids, loss_mask); raises RowRejected. ``cut``: whether the last row's text
    was cut before tokenizing (capture.inputs.row_size)."""

    def __init__(self, tok: Any, fmt: str, max_length: int) -> None:
        if fmt not in FORMATS:
            raise BadInput(f"unknown data format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.tok, self.fmt, self.masker = tok, fmt, None
        self.empty_replies: tuple[int, ...] = ()  # the last chat row's empty trained replies (kept)
        self.cap, self.max_length, self.cut = string_cap(tok, max_length), max_length, False

    def __call__(self, row: Any) -> tuple[list[int], list[int]]:
        if isinstance(row, BadRow):
            raise RowRejected(row.reason, row.detail)
        if not isinstance(row, dict):
            raise RowRejected("row is not a JSON object")
        row, chars, self.cut = clip_strings(row, self.cap)
        if chars > ROW_STRINGS * self.cap:
            raise RowRejected("too large to tokenize", f"{chars:,} characters of text with each string cut to "
                              f"{self.cap:,}; at most {ROW_STRINGS * self.cap:,} are tokenized for "
                              f"max_length={self.max_length}")
        if self.cut and (why := check_cut(self.tok, row, self.cap, self.max_length)):
            raise RowRejected("too large to tokenize", why)
        try:
            return self._tokenize(row)
        except BaseException as e:  # a Rust panic (pyo3's PanicException) is no Exception
            if type(e).__name__ != "PanicException":
                raise
            raise RowRejected("the tokenizer failed on the row", str(e).splitlines()[0][:300] if str(e) else "") from None

    def _tokenize(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        f = detect_format(row) if self.fmt == "auto" else self.fmt
        if f is None:
            raise RowRejected(UNKNOWN)
        if f in ("sharegpt", "openai"):
            if self.masker is None:
                self.masker = ChatMasker(self.tok)  # BadInput here if the template cannot be handled at all
            chat = to_chat(row, "conversations" if f == "sharegpt" else "messages")
            self.empty_replies = chat.empty_replies
            if len(chat.messages) > turn_cap(self.max_length):  # (masking time grows with the square of the turns)
                raise RowRejected("too large to tokenize", f"{len(chat.messages):,} messages; at most "
                                  f"{turn_cap(self.max_length):,} are tokenized for max_length={self.max_length}")
            return self.masker(chat.messages, chat.tools, chat.trained)
        if f == "text":
            text = row.get("text")
            if not isinstance(text, str):
                raise RowRejected("malformed text")
            if not text.strip():
                raise RowRejected("empty")
            ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
            return ids, [1] * len(ids)
        p, c = row.get("prompt"), row.get("completion")
        if not isinstance(p, str) or not isinstance(c, str):
            raise RowRejected("malformed prompt/completion")
        if not c.strip():
            raise RowRejected("empty")
        pi = list(self.tok(p, add_special_tokens=False)["input_ids"])
        ci = list(self.tok(c, add_special_tokens=False)["input_ids"])
        return pi + ci, [0] * len(pi) + [1] * len(ci)


PLAIN_TEXT = "The quick brown fox jumps over 13 lazy dogs."


def check_encodes_text(tok: Any) -> None:
    """BadInput when the tokenizer encodes plain text to nothing but special, added or unknown tokens (a BPE
    with an empty vocabulary): every sample would be the chat template's control tokens, not the text."""
    ids = list(tok(PLAIN_TEXT, add_special_tokens=False)["input_ids"])
    control = set(getattr(tok, "added_tokens_decoder", {}) or {}) | set(getattr(tok, "all_special_ids", []) or [])
    unk = getattr(tok, "unk_token_id", None)
    if not [i for i in ids if i not in control and i != unk]:
        raise BadInput(f"the tokenizer encodes plain text ({PLAIN_TEXT!r}) to {len(ids)} token(s), none of them an "
                       f"ordinary one (its vocabulary has {len(tok)} entries, {len(control)} of them special or "
                       "added): samples would hold control tokens only; use the model's complete tokenizer")


def _numbered(rows: Iterable[tuple]) -> Iterable[tuple[str, int, Any]]:
    """(file, number, row) from (file, number, row) or (file, row) items (numbered per file from 1)."""
    count: Counter = Counter()
    for item in rows:
        if len(item) == 3:
            yield item
        else:
            count[item[0]] += 1
            yield item[0], count[item[0]], item[1]


def _runs(mask: list[int]) -> int:
    """How many maximal runs of 1s (trained replies) ``mask`` holds."""
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def _fit(ids: list[int], mask: list[int], max_length: int, too_long: str, report: InputReport, file: str,
         n: int, cut: bool = False) -> tuple[list[int], list[int]]:
    """A tokenized row within ``max_length`` (truncated, and noted, unless ``too_long`` is "skip");
    RowRejected when it is too long to keep or has no trainable token. ``cut``: its text was cut before
    tokenizing, so it is at least ``len(ids)`` tokens long."""
    if len(ids) > max_length:
        length = f"at least {len(ids)} tokens (text cut before tokenizing)" if cut else f"{len(ids)} tokens"
        if too_long == "skip":
            raise RowRejected(f"longer than max_length={max_length}", length)
        runs, dropped = _runs(mask), _runs(mask[max_length - 1:]) - (mask[max_length - 1] == 1)
        if not any(mask[:max_length]):  # nothing of any reply is left: not a truncated row, a rejected one
            raise RowRejected(f"no reply within max_length={max_length}",
                              f"{length}; " + ("its one trained reply starts" if runs == 1 else
                                                          f"all {runs} trained replies start") + " past it")
        lost = f"; {dropped} of {runs} trained replies dropped whole" if dropped else ""
        report.note("truncated", file, n, f"truncated to max_length={max_length}", f"{length}{lost}")
        ids, mask = ids[:max_length], mask[:max_length]
        report.truncated += 1
        report.replies_dropped += dropped
    if not any(mask):
        raise RowRejected("no trainable tokens (loss mask empty)")
    return ids, mask


def tokenize_rows(
    rows: Iterable[tuple],
    tok: Any,
    tokenizer_fingerprint: str,
    fmt: str = "auto",
    max_length: int = 2048,
    too_long: str = "truncate",
    limit: int | None = None,
) -> tuple[list[SampleTokens], InputReport]:
    """Samples (deduplicated by key, input order kept) and a report of what was not taken as it was, and why.

    ``rows`` are (file, row number, row) as ``load_rows`` yields them, or (file, row).
    """
    check_encodes_text(tok)
    report = InputReport()
    samples: list[SampleTokens] = []
    first_seen: dict[str, str] = {}
    tokens = _Tokens(tok, fmt, max_length)
    for file, n, row in _numbered(rows):
        if limit is not None and report.usable >= limit:
            break
        report.rows += 1
        tokens.empty_replies = ()
        try:
            ids, mask = _fit(*tokens(row), max_length, too_long, report, file, n, tokens.cut)
        except RowRejected as r:
            report.rejected[r.reason] += 1
            report.note("rejected", file, n, r.reason, r.detail)
            continue
        a = np.asarray(ids, dtype=np.int32)
        m = np.asarray(mask, dtype=np.uint8)
        key = sample_key(tokenizer_fingerprint, a, m)
        if key in first_seen:
            report.duplicates += 1
            report.note("duplicate", file, n, "duplicate of an earlier row", first_seen[key])
            continue
        first_seen[key] = f"{file} row {n}"
        if tokens.empty_replies:
            report.empty_replies += 1
            report.note("empty_reply", file, n, "empty assistant reply (kept: trains the end-of-turn token)",
                        f"message(s) {', '.join(map(str, tokens.empty_replies))}")
        samples.append(SampleTokens(key, a, m))
        report.usable += 1
    report.close()
    if not samples:
        reasons = ", ".join(f"{k}: {v}" for k, v in report.rejected.items()) or "no rows"
        first = next((f"; first: {i.file} row {i.row}" for i in report.issues if i.kind == "rejected"), "")
        raise BadInput(f"no usable rows in the data files ({report.rows} rows read; {reasons}{first}); "
                       "check [data] files and format")
    return samples, report

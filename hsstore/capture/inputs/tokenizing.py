"""Input rows -> token samples: format detection, tokenization, loss masks, and a report naming every row
that was not taken as it was.

Formats, detected per row: ShareGPT (``conversations``), OpenAI (``messages``), plain ``text``, ``prompt`` +
``completion``. Loss mask: each assistant reply with its end-of-turn token for chats (hsstore.capture.inputs.lossmask),
completion tokens for prompt/completion, all tokens for text. Rejected, duplicate and truncated rows are
counted by reason and named (file, row, reason) in ``InputReport.issues``; nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hsstore.capture.inputs.datafiles import BadRow, load_rows
from hsstore.capture.inputs.lossmask import METHOD, ChatMasker
from hsstore.capture.inputs.messages import RowRejected, to_chat
from hsstore.core.errors import BadInput
from hsstore.core.keys import SampleTokens, sample_key
from hsstore.core.schema.build import RowIssue, RowIssueKind
from hsstore.core.schema.manifest import DATA_FORMATS as FORMATS

# --- A row's text is bounded before it is tokenized: tokenizing costs ~250 bytes of memory per character (a

MARGIN = 2  # a cut string spans twice max_length tokens: the text near the cut never reaches the kept tokens
ROW_STRINGS = 8  # a row may hold this many cut-size strings in all (a chat of many long turns)
UNKNOWN_LONGEST = 1024  # characters per token assumed of a tokenizer that cannot list its vocabulary
InputRow = tuple[str, int, Any] | tuple[str, Any]  # (file, number, row) as load_rows gives, or (file, row)


class NoUsableRows(BadInput):
    """No row of the data files gives a sample (each was rejected, or there were none)."""


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
            return (
                f"a string cut to {cap:,} characters makes only {n} tokens (max_length={max_length}): this "
                "tokenizer's tokens span more characters than its vocabulary's entries, so the cut could "
                "change the tokens kept"
            )
    return None


def turn_cap(max_length: int) -> int:
    """Messages a chat row may hold to be tokenized for rows kept to ``max_length`` tokens."""
    return MARGIN * (max_length + 16)


# --- InputReport: what tokenizing the data files gave, and every row not taken as it was, named with its reason.

NAMED_PER_REASON = 10_000  # rows named one by one for each (kind, reason); the rest are counted


@dataclass
class InputReport:
    rows: int = 0
    usable: int = 0
    truncated: int = 0
    replies_dropped: int = 0  # trained replies (loss-mask runs) that truncation cut off whole
    duplicates: int = 0
    empty_replies: int = 0  # kept rows with an empty trained reply among others (rows of only empty ones: rejected)
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> rows
    issues: list[RowIssue] = field(default_factory=list)  # rejected, duplicate and truncated rows, in order
    named: Counter[tuple[RowIssueKind, str]] = field(default_factory=Counter)  # (kind, reason) -> rows in ``issues``
    # (kind, reason) -> [file, row, count]: the first unnamed row, and how many
    unnamed: dict[tuple[RowIssueKind, str], list[Any]] = field(default_factory=dict)
    # reasons ``close`` named the unnamed rows of
    summarized: set[tuple[RowIssueKind, str]] = field(default_factory=set)

    def note(self, kind: RowIssueKind, file: str, row: int, reason: str, detail: str = "") -> None:
        if self.named[(kind, reason)] >= NAMED_PER_REASON:
            self.unnamed.setdefault((kind, reason), [file, row, 0])[2] += 1
            return
        self.named[(kind, reason)] += 1
        self.issues.append(
            RowIssue(file=file, row=row, kind=kind, reason=reason, **({"detail": detail} if detail else {}))
        )

    def close(self) -> None:
        """Add one issue for each reason whose rows were not all named: the first unnamed row, and how many
        (once; later calls add nothing)."""
        for (kind, reason), (file, row, n) in self.unnamed.items():
            if (kind, reason) not in self.summarized:
                self.summarized.add((kind, reason))
                self.issues.append(
                    RowIssue(
                        file=file,
                        row=row,
                        kind=kind,
                        reason=reason,
                        detail=(
                            f"this row and {n - 1:,} more {kind} for this reason, not named one by one (the first "
                            f"{NAMED_PER_REASON:,} are)"
                        ),
                    )
                )

    @property
    def issue_count(self) -> int:
        """Rows not taken as they were: every one counted, named or not."""
        unnamed: int = sum(n for _, _, n in self.unnamed.values())
        return sum(self.named.values()) + unnamed

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "usable": self.usable,
            "truncated": self.truncated,
            "replies_dropped": self.replies_dropped,
            "empty_replies": self.empty_replies,
            "duplicates": self.duplicates,
            "rejected": dict(self.rejected),
            "issue_count": self.issue_count,
            "loss_mask": METHOD,
        }


__all__ = ["InputReport", "InputRow", "detect_format", "load_rows", "tokenize_rows"]
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
        self.tok, self.fmt = tok, fmt
        self.masker: ChatMasker | None = None  # made at the first chat row
        self.empty_replies: tuple[int, ...] = ()  # the last chat row's empty trained replies (kept)
        self.cap, self.max_length, self.cut = string_cap(tok, max_length), max_length, False

    def __call__(self, row: Any) -> tuple[list[int], list[int]]:
        if isinstance(row, BadRow):
            raise RowRejected(row.reason, row.detail)
        if not isinstance(row, dict):
            raise RowRejected("row is not a JSON object")
        row, chars, self.cut = clip_strings(row, self.cap)
        if chars > ROW_STRINGS * self.cap:
            raise RowRejected(
                "too large to tokenize",
                f"{chars:,} characters of text with each string cut to "
                f"{self.cap:,}; at most {ROW_STRINGS * self.cap:,} are tokenized for "
                f"max_length={self.max_length}",
            )
        if self.cut and (why := check_cut(self.tok, row, self.cap, self.max_length)):
            raise RowRejected("too large to tokenize", why)
        try:
            return self._tokenize(row)
        except BaseException as e:  # a Rust panic (pyo3's PanicException) is no Exception
            if type(e).__name__ != "PanicException":
                raise
            raise RowRejected(
                "the tokenizer failed on the row", str(e).splitlines()[0][:300] if str(e) else ""
            ) from None

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
                raise RowRejected(
                    "too large to tokenize",
                    f"{len(chat.messages):,} messages; at most "
                    f"{turn_cap(self.max_length):,} are tokenized for max_length={self.max_length}",
                )
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
        raise BadInput(
            f"the tokenizer encodes plain text ({PLAIN_TEXT!r}) to {len(ids)} token(s), none of them an "
            f"ordinary one (its vocabulary has {len(tok)} entries, {len(control)} of them special or "
            "added): samples would hold control tokens only; use the model's complete tokenizer"
        )


def _numbered(rows: Iterable[InputRow]) -> Iterable[tuple[str, int, Any]]:
    """(file, number, row) from (file, number, row) or (file, row) items (numbered per file from 1)."""
    count: Counter[str] = Counter()
    for item in rows:
        if len(item) == 3:
            yield item
        else:
            count[item[0]] += 1
            yield item[0], count[item[0]], item[1]


def _runs(mask: list[int]) -> int:
    """How many maximal runs of 1s (trained replies) ``mask`` holds."""
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def _fit(
    ids: list[int],
    mask: list[int],
    max_length: int,
    too_long: str,
    report: InputReport,
    file: str,
    n: int,
    cut: bool = False,
) -> tuple[list[int], list[int]]:
    """A tokenized row within ``max_length`` (truncated, and noted, unless ``too_long`` is "skip");
    RowRejected when it is too long to keep or has no trainable token. ``cut``: its text was cut before
    tokenizing, so it is at least ``len(ids)`` tokens long."""
    if len(ids) > max_length:
        length = f"at least {len(ids)} tokens (text cut before tokenizing)" if cut else f"{len(ids)} tokens"
        if too_long == "skip":
            raise RowRejected(f"longer than max_length={max_length}", length)
        runs, dropped = _runs(mask), _runs(mask[max_length - 1 :]) - (mask[max_length - 1] == 1)
        if not any(mask[:max_length]):  # nothing of any reply is left: not a truncated row, a rejected one
            raise RowRejected(
                f"no reply within max_length={max_length}",
                f"{length}; "
                + ("its one trained reply starts" if runs == 1 else f"all {runs} trained replies start")
                + " past it",
            )
        lost = f"; {dropped} of {runs} trained replies dropped whole" if dropped else ""
        report.note("truncated", file, n, f"truncated to max_length={max_length}", f"{length}{lost}")
        ids, mask = ids[:max_length], mask[:max_length]
        report.truncated += 1
        report.replies_dropped += dropped
    if not any(mask):
        raise RowRejected("no trainable tokens (loss mask empty)")
    return ids, mask


def _fitted(
    rows: Iterable[InputRow], tokens: _Tokens, too_long: str, limit: int | None, report: InputReport
) -> Iterator[tuple[str, int, list[int], list[int]]]:
    """(file, row number, input_ids, loss_mask) of each row that tokenizes and fits max_length (``_fit``), until
    ``report.usable`` reaches ``limit``; every row read is counted in ``report``, each rejected one named with its
    reason. ``tokens.empty_replies`` is the yielded row's."""
    for file, n, row in _numbered(rows):
        if limit is not None and report.usable >= limit:
            break
        report.rows += 1
        tokens.empty_replies = ()
        try:
            ids, mask = _fit(*tokens(row), tokens.max_length, too_long, report, file, n, tokens.cut)
        except RowRejected as r:
            report.rejected[r.reason] += 1
            report.note("rejected", file, n, r.reason, r.detail)
            continue
        yield file, n, ids, mask


def tokenize_rows(
    rows: Iterable[InputRow],
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
    for file, n, ids, mask in _fitted(rows, tokens, too_long, limit, report):
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
            report.note(
                "empty_reply",
                file,
                n,
                "empty assistant reply (kept: trains the end-of-turn token)",
                f"message(s) {', '.join(map(str, tokens.empty_replies))}",
            )
        samples.append(SampleTokens(key, a, m))
        report.usable += 1
    report.close()
    if not samples:
        reasons = ", ".join(f"{k}: {v}" for k, v in report.rejected.items()) or "no rows"
        first = next((f"; first: {i.file} row {i.row}" for i in report.issues if i.kind == "rejected"), "")
        raise NoUsableRows(
            f"no usable rows in the data files ({report.rows} rows read; {reasons}{first}); "
            "check [data] files and format"
        )
    return samples, report

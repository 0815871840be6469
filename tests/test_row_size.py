"""A row far longer than max_length is cut before it is tokenized: tokenizing costs ~250 bytes a character (a
20 MB JSON line took 5 GB and 45 s before), and the tokens kept are those of the whole text."""

from __future__ import annotations

from typing import Any

from hsstore.capture.inputs.row_size import ROW_STRINGS, string_cap
from hsstore.capture.inputs.tokenizing import tokenize_rows
from hsstore.capture.model.builtin import builtin_tokenizer

TOK = builtin_tokenizer()
MAX = 16
LONG = "the quick brown fox jumps over 13 lazy dogs. " * 20_000  # 900k characters: ~900 ms to tokenize whole


class Seen:
    """The real tokenizer, noting the longest text it was handed (the test's only addition)."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.longest = tok, 0

    def __call__(self, text: str, **kw: Any) -> Any:
        self.longest = max(self.longest, len(text))
        return self.tok(text, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


def test_a_huge_text_is_cut_before_tokenizing_and_keeps_the_whole_texts_tokens():
    seen = Seen(TOK)
    (s,), rep = tokenize_rows([("f", {"text": LONG})], seen, "fp", max_length=MAX)
    assert seen.longest <= string_cap(TOK, MAX) < len(LONG)
    assert s.input_ids.tolist() == list(TOK(LONG, add_special_tokens=False)["input_ids"])[:MAX]
    (issue,) = rep.issues
    assert issue.kind == "truncated" and issue.detail.startswith("at least")


def test_a_huge_prompt_still_leaves_no_reply_and_skip_still_refuses():
    _, rep = tokenize_rows([("f", {"prompt": LONG, "completion": "ok"}), ("f", {"text": "short"})], TOK, "fp",
                           max_length=MAX)
    assert dict(rep.rejected) == {f"no reply within max_length={MAX}": 1}
    _, rep = tokenize_rows([("f", {"text": LONG}), ("f", {"text": "short"})], TOK, "fp", max_length=MAX,
                           too_long="skip")
    assert dict(rep.rejected) == {f"longer than max_length={MAX}": 1}


def test_a_row_of_many_huge_turns_is_rejected_untokenized():
    cap = string_cap(TOK, MAX)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": LONG[: cap + 1]}
             for i in range(2 * ROW_STRINGS + 2)]
    seen = Seen(TOK)
    _, rep = tokenize_rows([("f", {"messages": turns}), ("f", {"text": "short"})], seen, "fp", max_length=MAX)
    assert dict(rep.rejected) == {"too large to tokenize": 1}
    assert rep.usable == 1


def _backtracking_tokenizer() -> Any:
    """The builtin tokenizer with a pre-tokenizer regex that backtracks exponentially on a run of ``a``: the
    regex engine gives up at its retry limit, and the tokenizer panics (a Rust panic, not an Exception)."""
    import copy

    from tokenizers import Regex, pre_tokenizers

    tok = copy.deepcopy(TOK)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"(a|aa)+$"), behavior="isolated"), tok.backend_tokenizer.pre_tokenizer])
    return tok


def test_a_row_the_tokenizer_panics_on_is_a_rejected_row_not_a_traceback():
    rows = [("f", {"text": "a" * 60 + "b"}), ("f", {"text": "hello world"})]
    (s,), rep = tokenize_rows(rows, _backtracking_tokenizer(), "fp", max_length=MAX)
    assert dict(rep.rejected) == {"the tokenizer failed on the row": 1}
    assert "retry-limit" in rep.issues[0].detail and rep.issues[0].row == 1


def test_rows_rejected_by_the_million_are_counted_exactly_but_named_a_bounded_number_of_times():
    """A parquet file of millions of rows all rejected for one reason is kilobytes on disk; each named row
    held ~600 bytes (2 M rows: 1.3 GB, and a 295 MB rows.jsonl in the store). The first NAMED_PER_REASON
    rows of a reason are named, one more issue names the first of the rest and how many; counts stay exact."""
    from hsstore.capture.inputs.row_report import NAMED_PER_REASON

    extra = 50
    rows = [("f", {"text": f"row {i}"}) for i in range(3)] + [("f", {"foo": 1})] * (NAMED_PER_REASON + extra)
    samples, rep = tokenize_rows(rows, TOK, "fp", max_length=MAX)
    assert len(samples) == 3 and sum(rep.rejected.values()) == NAMED_PER_REASON + extra
    assert rep.to_dict()["issue_count"] == NAMED_PER_REASON + extra
    assert len(rep.issues) == NAMED_PER_REASON + 1
    last = rep.issues[-1]
    assert last.row == 3 + NAMED_PER_REASON + 1 and f"this row and {extra - 1} more rejected" in last.detail


def test_a_chat_of_more_turns_than_max_length_can_hold_is_rejected_untokenized():
    """10,000 two-letter turns (a 300 KB line, or a few KB of parquet) took 214 s to mask: the masker's time
    grows with the square of the turns. Every message renders at least its role's header, so a chat of more
    than twice max_length messages is far past the cut: rejected before it is rendered."""
    from hsstore.capture.inputs.row_size import turn_cap

    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(turn_cap(MAX) + 2)]
    _, rep = tokenize_rows([("f", {"messages": many}), ("f", {"text": "short"})], TOK, "fp", max_length=MAX)
    assert dict(rep.rejected) == {"too large to tokenize": 1} and "messages; at most" in rep.issues[0].detail

"""A row far longer than max_length is cut before it is tokenized: tokenizing costs ~250 bytes a character (a
20 MB JSON line took 5 GB and 45 s before), and the tokens kept are those of the whole text."""

from __future__ import annotations

from typing import Any

from hsstore.capture.inputs.tokenizing import ROW_STRINGS, string_cap, tokenize_rows
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
    _, rep = tokenize_rows(
        [("f", {"prompt": LONG, "completion": "ok"}), ("f", {"text": "short"})], TOK, "fp", max_length=MAX
    )
    assert dict(rep.rejected) == {f"no reply within max_length={MAX}": 1}
    _, rep = tokenize_rows(
        [("f", {"text": LONG}), ("f", {"text": "short"})], TOK, "fp", max_length=MAX, too_long="skip"
    )
    assert dict(rep.rejected) == {f"longer than max_length={MAX}": 1}


def test_a_row_of_many_huge_turns_is_rejected_untokenized():
    cap = string_cap(TOK, MAX)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": LONG[: cap + 1]} for i in range(2 * ROW_STRINGS + 2)
    ]
    seen = Seen(TOK)
    _, rep = tokenize_rows([("f", {"messages": turns}), ("f", {"text": "short"})], seen, "fp", max_length=MAX)
    assert dict(rep.rejected) == {"too large to tokenize": 1}
    assert seen.longest < cap  # no turn of the huge row reached the tokenizer
    assert rep.usable == 1


def _backtracking_tokenizer() -> Any:
    """The builtin tokenizer with a pre-tokenizer regex that backtracks exponentially on a run of ``a``: the
    regex engine gives up at its retry limit, and the tokenizer panics (a Rust panic, not an Exception)."""
    import copy

    from tokenizers import Regex, pre_tokenizers

    tok = copy.deepcopy(TOK)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"(a|aa)+$"), behavior="isolated"), tok.backend_tokenizer.pre_tokenizer]
    )
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
    from hsstore.capture.inputs.tokenizing import NAMED_PER_REASON

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
    from hsstore.capture.inputs.tokenizing import turn_cap

    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(turn_cap(MAX) + 2)]
    _, rep = tokenize_rows([("f", {"messages": many}), ("f", {"text": "short"})], TOK, "fp", max_length=MAX)
    assert dict(rep.rejected) == {"too large to tokenize": 1} and "messages; at most" in rep.issues[0].detail


def _wordpiece_tokenizer() -> Any:
    """A WordPiece tokenizer (BERT's kind), built offline: a word it cannot split is one ``[UNK]``, whatever its
    length, so one token may span far more characters than its longest vocabulary entry."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "hello": 2, "world": 3, "a": 4, "##a": 5, "quick": 6}
    inner = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", pad_token="[PAD]")


def test_a_cut_that_would_change_the_kept_tokens_rejects_the_row():
    """The cut is sound only where no token spans more characters than the longest vocabulary entry. A
    WordPiece [UNK] spans a whole unknown word: a string cut inside such a word would lose the words after
    it while the row still fits max_length, and be kept silently wrong. Such a row is refused instead."""
    tok = _wordpiece_tokenizer()
    word = "b" * (string_cap(tok, MAX) + 10)  # one unknown word longer than the cut
    whole = list(tok(f"{word} hello world", add_special_tokens=False)["input_ids"])
    assert whole == [0, 2, 3]  # the whole text: [UNK] hello world (3 tokens, within max_length)
    samples, rep = tokenize_rows(
        [("f", {"text": f"{word} hello world"}), ("f", {"text": "hello"})], tok, "fp", max_length=MAX
    )
    kept = [s.input_ids.tolist() for s in samples]
    assert [0] not in kept  # not the cut text's tokens ([UNK] alone)
    assert kept == [[2]] and dict(rep.rejected) == {"too large to tokenize": 1}

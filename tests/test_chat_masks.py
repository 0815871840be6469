"""Loss masks under real chat templates: exactly each assistant reply plus its end-of-turn token."""

from __future__ import annotations

import json
from pathlib import Path

from chat_fixtures import make_tokenizer, spans

from hsstore.build.inputs import load_rows, tokenize_rows

TWO_TURNS = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "It is four."},
             {"role": "user", "content": "And three plus three?"}, {"role": "assistant", "content": "It is six."}]


def _samples(tmp_path: Path, tok, rows: list[dict]):
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tokenize_rows(load_rows([str(f)]), tok, "fp")


def test_qwen3_multi_turn_mask_never_covers_user_text(tmp_path: Path):
    """Qwen3 renders <think> only after the last user query: a prefix's rendering is no prefix of the whole."""
    tok = make_tokenizer("qwen3")
    (s,), _ = _samples(tmp_path, tok, [{"messages": TWO_TURNS}])
    got = spans(tok, s.input_ids, s.loss_mask)
    assert not any("three plus three" in g or "<|im_start|>user" in g for g in got), got
    assert got == ["It is four.<|im_end|>", "<think>\n\n</think>\n\nIt is six.<|im_end|>"]

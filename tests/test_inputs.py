from __future__ import annotations

import json
from pathlib import Path

import pytest

from hsstore.build.builtin import builtin_tokenizer
from hsstore.core.errors import BadInput
from hsstore.build.inputs import load_rows, tokenize_rows

from helpers import DATA

TOK = builtin_tokenizer()


def _tok(rows, **kw):
    return tokenize_rows((("f", r) for r in rows), TOK, "fp", **kw)


def _text(ids, mask):
    return TOK.decode([i for i, m in zip(ids, mask) if m])


def test_sharegpt_and_openai_give_the_same_sample():
    share = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                               {"from": "gpt", "value": "A"}]}
    oai = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "A"}]}
    (a,), _ = _tok([share])
    (b,), _ = _tok([oai])
    assert a.key == b.key


def test_multi_turn_loss_mask_covers_assistant_turns_only():
    row = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                        {"role": "assistant", "content": "ANSWER-ONE"}, {"role": "user", "content": "q2"},
                        {"role": "assistant", "content": "ANSWER-TWO"}]}
    (s,), _ = _tok([row])
    masked = _text(s.input_ids, s.loss_mask)
    assert "ANSWER-ONE" in masked and "ANSWER-TWO" in masked
    assert "q1" not in masked and "sys" not in masked and "q2" not in masked


def test_text_and_prompt_completion_masks():
    (t,), _ = _tok([{"text": "hello world"}])
    assert t.loss_mask.all()
    (p,), _ = _tok([{"prompt": "PROMPT ", "completion": "COMPLETION"}])
    assert _text(p.input_ids, p.loss_mask) == "COMPLETION"


def test_truncate_and_skip_policies():
    long = {"text": "x" * 100}
    (s,), rep = _tok([long, {"text": "short"}][:1], max_length=10, too_long="truncate")
    assert s.length == 10 and rep.truncated == 1
    samples, rep = _tok([long, {"text": "short"}], max_length=10, too_long="skip")
    assert len(samples) == 1 and rep.rejected["longer than max_length=10"] == 1


def test_rejections_are_counted_by_reason():
    rows = [{"text": ""}, {"messages": "not a list"}, {"messages": [{"role": "user", "content": "q"}]},
            {"other": 1}, {"text": "ok"}, {"text": "ok"}]
    samples, rep = _tok(rows)
    assert len(samples) == 1 and rep.duplicates == 1
    assert rep.rejected == {"empty": 1, "malformed chat": 1, "no assistant turn": 1,
                            "unknown format (no conversations/messages/text/prompt+completion)": 1}


def test_nothing_usable_is_an_error():
    with pytest.raises(BadInput, match="no usable rows"):
        _tok([{"text": ""}, {"x": 1}])


def test_chat_data_without_template_is_an_error():
    tok = builtin_tokenizer()
    tok.chat_template = None
    with pytest.raises(BadInput, match="no chat template"):
        tokenize_rows([("f", {"messages": [{"role": "user", "content": "q"}]})], tok, "fp")


def test_formats_load_from_jsonl_json_parquet_and_save_to_disk(tmp_path: Path):
    import datasets

    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:6]]
    keys = {}
    ds = datasets.Dataset.from_list([{"messages": r["messages"]} for r in rows if "messages" in r])
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in ds))
    (tmp_path / "a.json").write_text(json.dumps([{"messages": r["messages"]} for r in ds]))
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "a.hf"))
    for name in ("a.jsonl", "a.json", "a.parquet", "a.hf"):
        samples, _ = tokenize_rows(load_rows([str(tmp_path / name)]), TOK, "fp")
        keys[name] = [s.key for s in samples]
    assert len(set(map(tuple, keys.values()))) == 1 and keys["a.jsonl"]


def test_reordered_or_filtered_input_keeps_keys():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:10]]
    a, _ = _tok(rows)
    b, _ = _tok(list(reversed(rows))[::2])
    assert {s.key for s in b} <= {s.key for s in a}

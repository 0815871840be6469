from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_fixtures import make_tokenizer, spans
from helpers import DATA

from hsstore.capture.inputs.tokenizing import load_rows, tokenize_rows
from hsstore.capture.model.builtin import builtin_tokenizer
from hsstore.core.errors import BadInput, ResourceLimit

TOK = builtin_tokenizer()


def _tok(rows, **kw):
    return tokenize_rows((("f", r) for r in rows), TOK, "fp", **kw)


def _text(ids, mask):
    return TOK.decode([i for i, m in zip(ids, mask) if m])


def test_sharegpt_and_openai_give_the_same_sample():
    share = {
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "Q"},
            {"from": "gpt", "value": "A"},
        ]
    }
    oai = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
        ]
    }
    (a,), _ = _tok([share])
    (b,), _ = _tok([oai])
    assert a.key == b.key


def test_multi_turn_loss_mask_covers_assistant_turns_only():
    row = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "ANSWER-ONE"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "ANSWER-TWO"},
        ]
    }
    (s,), _ = _tok([row])
    masked = _text(s.input_ids, s.loss_mask)
    assert "ANSWER-ONE" in masked and "ANSWER-TWO" in masked
    assert "q1" not in masked and "sys" not in masked and "q2" not in masked


def test_text_and_prompt_completion_masks():
    (t,), _ = _tok([{"text": "hello world"}])
    assert len(t.loss_mask) == len(t.input_ids) > 0 and t.loss_mask.all()
    (p,), _ = _tok([{"prompt": "PROMPT ", "completion": "COMPLETION"}])
    assert _text(p.input_ids, p.loss_mask) == "COMPLETION"


def test_truncate_and_skip_policies():
    long = {"text": "x" * 100}
    (s,), rep = _tok([long, {"text": "short"}][:1], max_length=10, too_long="truncate")
    assert s.length == 10 and rep.truncated == 1
    samples, rep = _tok([long, {"text": "short"}], max_length=10, too_long="skip")
    assert len(samples) == 1 and rep.rejected["longer than max_length=10"] == 1


def test_rejections_are_counted_by_reason():
    rows = [
        {"text": ""},
        {"messages": "not a list"},
        {"messages": [{"role": "user", "content": "q"}]},
        {"other": 1},
        {"text": "ok"},
        {"text": "ok"},
    ]
    samples, rep = _tok(rows)
    assert len(samples) == 1 and rep.duplicates == 1
    assert rep.rejected == {
        "empty": 1,
        "malformed chat": 1,
        "no assistant turn": 1,
        "unknown format (no conversations/messages/text/prompt+completion)": 1,
    }


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


def test_parquet_is_streamed_never_copied_and_a_bomb_is_refused(tmp_path: Path, monkeypatch):
    """A parquet file is read where it is: nothing lands in the datasets cache (load_dataset decoded every
    file into an Arrow copy there, a few KB of repeated rows becoming its decoded size); a row group whose
    decoded size would not fit the memory budget is one line before it is read."""
    import datasets.config
    import pyarrow as pa
    import pyarrow.parquet as pq

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    rows = [{"text": f"row {i} " + "x" * 2000} for i in range(3000)]  # ~6 MB decoded
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet", compression="zstd")
    assert (tmp_path / "r.parquet").stat().st_size < 1_000_000
    got = list(load_rows([str(tmp_path / "r.parquet")]))
    assert [(n, r) for _, n, r in got] == list(enumerate(rows, 1))
    assert not cache.exists() or not any(cache.rglob("*"))
    monkeypatch.setenv("HSSTORE_MEMORY_BUDGET", "1M")
    with pytest.raises(ResourceLimit, match=r"r\.parquet': row group 0 \(3,000 rows\) decoded needs .* memory budget"):
        list(load_rows([str(tmp_path / "r.parquet")]))


def test_a_json_list_is_priced_before_it_is_parsed_whole(tmp_path: Path, monkeypatch):
    """A .json list is parsed whole (~10x its size in Python objects): past the memory budget it is one line
    naming JSON Lines as the fix, before it is read; a .jsonl file of the same rows streams under any budget."""
    rows = [{"text": f"row {i} " + "x" * 200} for i in range(50)]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("HSSTORE_MEMORY_BUDGET", str((tmp_path / "r.json").stat().st_size * 2))
    with pytest.raises(ResourceLimit, match=r"r\.json' \(.* of JSON, parsed whole\) needs .* write it as JSON Lines"):
        list(load_rows([str(tmp_path / "r.json")]))
    assert [r for _, _, r in load_rows([str(tmp_path / "r.jsonl")])] == rows


def test_reordered_or_filtered_input_keeps_keys():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:10]]
    a, _ = _tok(rows)
    b, _ = _tok(list(reversed(rows))[::2])
    assert (len(a), len(b)) == (10, 5) and {s.key for s in b} <= {s.key for s in a}


# --- real-world row shapes -------------------------------------------------------------------------------

QTOK = make_tokenizer("qwen3")


def _q(rows, **kw):
    return tokenize_rows((("f", r) for r in rows), QTOK, "fp", **kw)


def _key(row) -> str:
    (s,), _ = _q([row])
    return s.key


def test_content_parts_are_joined_and_non_text_parts_refused():
    parts = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]},
        ]
    }
    flat = {"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"}]}
    assert _key(parts) == _key(flat)
    image = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "what is it?"}],
            },
            {"role": "assistant", "content": "a cat"},
        ]
    }
    samples, rep = _q([image, flat])
    assert len(samples) == 1 and rep.rejected == {"non-text content part (only text is supported)": 1}
    assert rep.issues[0].detail == "message 0 (user): type 'image_url'"


def test_role_names_in_any_case_and_common_aliases():
    want = _key(
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "A"},
            ]
        }
    )
    for sys_, user, bot in [
        ("SYSTEM", "Human", "GPT"),
        ("developer", "user", "ChatGPT"),
        ("System", "HUMAN", "bing"),
        ("system", "human", "model"),
        ("system", "user", "Assistant"),
        ("system", "human", "bard"),
    ]:
        row = {
            "conversations": [{"from": sys_, "value": "S"}, {"from": user, "value": "Q"}, {"from": bot, "value": "A"}]
        }
        assert _key(row) == want, (sys_, user, bot)
    samples, rep = _q(
        [{"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "A"}]}, {"text": "t"}]
    )
    assert rep.rejected == {"unknown role": 1} and rep.issues[0].detail == "message 0: 'narrator'"


def test_tool_calls_and_results_in_openai_and_sharegpt_shapes():
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    openai = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": call}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ]
    }
    flat = json.loads(json.dumps(openai))
    flat["messages"][1]["tool_calls"] = [call]  # {"name", "arguments"} without the "function" wrapper
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "Weather?"},
            {"from": "function_call", "value": json.dumps(call)},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": "Sunny."},
        ]
    }
    (s,), _ = _q([openai])
    assert _key(flat) == _key(sharegpt) == s.key
    got = spans(QTOK, s.input_ids, s.loss_mask)
    assert got[0] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    assert got[1] == "<think>\n\n</think>\n\nSunny.<|im_end|>" and "sunny" not in "".join(got)


def test_tool_call_arguments_keep_their_own_keys():
    """Read through Arrow, the first row's arguments would gain the second row's key as null."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {k: "v"}}}],
                },
            ]
        }
        for k in ("city", "query")
    ]
    (tmp := Path(__import__("tempfile").mkdtemp()) / "tools.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    samples, _ = tokenize_rows(load_rows([str(tmp)]), QTOK, "fp")
    first = QTOK.decode(samples[0].input_ids)
    assert '"arguments": {"city": "v"}' in first and "query" not in first


def test_reasoning_field_names_and_row_tools():
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    keys = {
        _key({"messages": [base[0], {**base[1], name: "because"}]})
        for name in ("reasoning_content", "reasoning", "thinking")
    }
    assert len(keys) == 1
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert _key({"messages": base, "tools": tools}) == _key({"messages": base, "tools": json.dumps(tools)})
    assert _key({"messages": base, "tools": tools}) != _key({"messages": base})


def test_rejected_duplicate_and_truncated_rows_are_named(tmp_path: Path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "hello"}\n\n{"text": ""}\n{"text": "hello"}\nnot json\n{"text": "' + "x" * 40 + '"}\n')
    samples, rep = tokenize_rows(load_rows([str(f)]), TOK, "fp", max_length=10)
    assert len(samples) == 2
    named = [(i.row, i.kind, i.reason, i.to_dict().get("detail")) for i in rep.issues]
    assert named == [
        (3, "rejected", "empty", None),
        (4, "duplicate", "duplicate of an earlier row", f"{f} row 1"),
        (5, "rejected", "invalid JSON line", "Expecting value at column 1"),
        (6, "truncated", "truncated to max_length=10", "40 tokens"),
    ]
    assert {i.file for i in rep.issues} == {str(f)}
    d = rep.to_dict()
    assert {"rows", "usable", "truncated", "duplicates", "rejected"} <= set(d) and d["issue_count"] == 4


# --- data files that hold no rows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.jsonl", b"", "is empty"),
        ("blank.json", b" \n\n\t\n", "is empty"),
        (
            "latin1.jsonl",
            '{"text": "ok"}\n{"text": "caf\xe9"}\n'.encode("latin-1"),
            r"is not UTF-8 text \(byte 0xe9 at line 2\)",
        ),
        ("latin1.json", '[{"text": "caf\xe9"}]'.encode("latin-1"), r"is not UTF-8 text \(byte 0xe9 at offset 14\)"),
        ("object.json", b'{"data": [{"text": "a"}]}', r"holds one JSON object \(keys \['data'\]\), not rows"),
        (
            "pretty.jsonl",
            b'{\n  "version": 1,\n  "rows": []\n}\n',
            r"holds one JSON object \(keys \['rows', 'version'\]\)",
        ),
        ("scalar.json", b"42", "holds a JSON number, not rows"),
        ("string.json", b'"text"', "holds a JSON string, not rows"),
        ("garbage.json", b"\x00\x01binary", "is neither JSON nor JSON Lines"),
    ],
)
def test_files_without_rows_are_one_line_bad_input(tmp_path: Path, name: str, content: bytes, message: str):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(BadInput, match=message) as e:
        list(load_rows([str(tmp_path / name)]))
    assert name in str(e.value) and "\n" not in str(e.value)


def _nested(depth: int) -> str:
    """A JSON value ``depth`` lists deep: a few bytes on disk, a RecursionError for recursive parsers."""
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [100, 100_000])  # parses, but deeper than any row; too deep to parse at all
def test_rows_nested_too_deeply_are_rejected_rows_not_tracebacks(tmp_path: Path, depth: int):
    from hsstore.core.nesting import MAX_INPUT_DEPTH

    f = tmp_path / "d.jsonl"
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    f.write_text(
        "\n".join(
            [
                '{"messages": ' + _nested(depth) + "}",  # the row itself
                json.dumps({"messages": chat, "tools": _nested(depth)}),  # a JSON string inside the row
                json.dumps({"text": "ok"}),
            ]
        )
        + "\n"
    )
    samples, rep = tokenize_rows(load_rows([str(f)]), TOK, "fp")
    assert len(samples) == 1 and rep.rejected == {"nested too deeply": 2}
    assert all(str(MAX_INPUT_DEPTH) in i.to_dict()["detail"] for i in rep.issues)
    (tmp_path / "l.json").write_text("[" + json.dumps({"messages": json.loads(_nested(100))}) + ', {"text": "ok"}]')
    samples, rep = tokenize_rows(load_rows([str(tmp_path / "l.json")]), TOK, "fp")
    assert len(samples) == 1 and rep.rejected == {"nested too deeply": 1}
    (tmp_path / "w.json").write_text(_nested(100_000))  # the whole file: one line, not a traceback
    with pytest.raises(BadInput, match=r"w\.json' is nested too deeply to parse"):
        list(load_rows([str(tmp_path / "w.json")]))


def test_numbers_too_long_to_read_are_rejected_rows_not_tracebacks(tmp_path: Path):
    """A number of thousands of digits (past Python's int conversion limit) in a row, or in a tools string,
    is an invalid JSON line; json.loads raises a plain ValueError for it, not a JSONDecodeError."""
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    long = "1" * 5000
    (tmp_path / "d.jsonl").write_text(
        '{"text": "x", "n": '
        + long
        + "}\n"
        + json.dumps({"messages": chat, "tools": "[" + long + "]"})
        + "\n"
        + json.dumps({"text": "ok"})
        + "\n"
    )
    samples, rep = tokenize_rows(load_rows([str(tmp_path / "d.jsonl")]), TOK, "fp")
    assert len(samples) == 1 and rep.rejected == {"invalid JSON line": 1, "tools is not JSON": 1}
    assert "a number longer than" in rep.issues[0].to_dict()["detail"]


def test_lone_surrogates_are_rejected_rows_not_tracebacks(tmp_path: Path):
    """JSON may escape half of a UTF-16 pair ("\\ud800") that no tokenizer can encode: in a row's text, a key, a
    JSON list's row or a tools JSON string it is a rejected row, named; a whole pair (an emoji) is text."""
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    lines = [
        '{"text": "hi \\ud800 there"}',
        '{"messages": [{"role": "user", "content": "q\\udfff"}, {"role": "assistant", "content": "a"}]}',
        json.dumps({"messages": chat, "tools": '[{"\\udc00": 1}]'}),
        '{"text": "an emoji \\ud83d\\ude00 is fine"}',
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "l.json").write_text("[" + lines[0] + ', {"text": "ok"}]')
    samples, rep = tokenize_rows(load_rows([str(tmp_path / "d.jsonl"), str(tmp_path / "l.json")]), TOK, "fp")
    assert len(samples) == 2 and rep.rejected == {"not Unicode text": 4}
    assert [i.to_dict()["detail"].split("surrogate ")[1][:6] for i in rep.issues] == [
        "\\ud800",
        "\\udfff",
        "\\udc00",
        "\\ud800",
    ]


@pytest.mark.parametrize("name", ["d.parquet", "d.jsonl"])
def test_a_fifo_named_as_a_data_file_is_refused_not_read_forever(tmp_path: Path, name: str):
    import os

    os.mkfifo(tmp_path / name)  # no writer: opening it would block the build for good
    with pytest.raises(BadInput, match=f"data file '.*{name}' is not a regular file"):
        list(load_rows([str(tmp_path / name)]))


def test_json_variants_that_are_rows(tmp_path: Path):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    (tmp_path / "one.json").write_text(json.dumps(row, indent=2))  # a single row, pretty-printed
    (tmp_path / "lines.json").write_text(json.dumps(row) + "\n" + json.dumps({"text": "t"}) + "\n")
    (tmp_path / "list.json").write_text(json.dumps([row, 7]))
    got = list(load_rows([str(tmp_path / n) for n in ("bom.jsonl", "one.json", "lines.json", "list.json")]))
    assert [(Path(f).name, n) for f, n, _ in got] == [
        ("bom.jsonl", 1),
        ("one.json", 1),
        ("lines.json", 1),
        ("lines.json", 2),
        ("list.json", 1),
        ("list.json", 2),
    ]
    _, rep = tokenize_rows(got, TOK, "fp")
    assert rep.rejected == {"row is not a JSON object": 1}


def test_weight_zero_turns_stay_in_the_prompt_but_out_of_the_loss():
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "bad answer", "weight": 0},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "good answer", "weight": 1},
    ]
    (s,), _ = _q([{"messages": msgs}])
    assert spans(QTOK, s.input_ids, s.loss_mask) == ["<think>\n\n</think>\n\ngood answer<|im_end|>"]
    assert "bad answer" in QTOK.decode(s.input_ids)
    bad = [
        {"messages": [msgs[0], {**msgs[1], "weight": 0.5}]},
        {"messages": [{**msgs[0], "weight": 1}, msgs[3]]},
        {"messages": [msgs[0], msgs[1]]},
        {"text": "t"},
    ]
    _, rep = _q(bad)
    assert rep.rejected == {
        "weight is neither 0 nor 1": 1,
        "weight on a message that is not the assistant's": 1,
        "no trainable tokens (loss mask empty)": 1,
    }


def test_a_system_field_of_the_row_is_its_system_prompt():
    conv = [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]
    field = {"system": "Be brief.", "conversations": conv}
    inline = {"conversations": [{"from": "system", "value": "Be brief."}, *conv]}
    assert _key(field) == _key(inline)
    _, rep = _q([{**inline, "system": "Other."}, {"text": "t"}])
    assert rep.rejected == {"a system prompt both as the row's field and as its first message": 1}


def test_a_row_whose_every_reply_lies_past_max_length_is_rejected_as_such_not_truncated():
    """A long prompt (a tool schema, a document) before every reply: the cut keeps no trained token, so the
    row is not taken; it is named once, with that reason, and counts neither as truncated nor as dropped
    replies of a kept row."""
    long_prompt = {
        "messages": [
            {"role": "user", "content": "word " * 400},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "B"},
        ]
    }
    kept = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}
    (full,), _ = _tok([long_prompt], max_length=10_000)
    first = list(full.loss_mask).index(1)
    samples, rep = _tok([long_prompt, kept], max_length=first)
    assert len(samples) == 1 and rep.usable == 1
    assert rep.truncated == 0 and rep.replies_dropped == 0
    reason = f"no reply within max_length={first}"
    assert rep.rejected == {reason: 1}
    (issue,) = rep.issues
    assert (issue.kind, issue.row, issue.reason) == ("rejected", 1, reason)
    assert issue.detail == f"{full.length} tokens; all 2 trained replies start past it"
    _, rep = _tok([long_prompt, kept], max_length=first, too_long="skip")  # skip names the length, as before
    assert rep.rejected == {f"longer than max_length={first}": 1}


def test_truncation_that_drops_whole_replies_counts_them():
    turns = [{"role": r, "content": f"{r} turn {i}"} for i in range(4) for r in ("user", "assistant")]
    row = {"messages": turns}
    (full,), _ = _tok([row], max_length=10_000)
    mask = list(full.loss_mask)
    runs = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]  # where each reply starts
    assert len(runs) == 4
    cut = runs[1] + 1  # keeps the first reply and one token of the second: two dropped whole
    (s,), rep = _tok([row], max_length=cut)
    assert s.length == cut and rep.truncated == 1 and rep.replies_dropped == len(runs) - 2
    (issue,) = rep.issues
    assert issue.detail == f"{len(mask)} tokens; {len(runs) - 2} of {len(runs)} trained replies dropped whole"
    assert rep.to_dict()["replies_dropped"] == len(runs) - 2
    (s,), rep = _tok([row], max_length=runs[-1] + 1)  # only the last reply cut, none dropped whole
    assert rep.truncated == 1 and rep.replies_dropped == 0 and "dropped" not in rep.issues[0].detail


def test_empty_assistant_replies_are_rejected_when_alone_and_counted_and_named_when_kept():
    """A row whose every trained reply is empty would train only the end-of-turn token after the prompt:
    it is rejected, by its own reason. A row with an empty reply among real ones is kept (that turn trains
    its end-of-turn token), counted and named with the message index. Before, both were kept silently."""
    only = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}
    mixed = {
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "ANSWER"},
        ]
    }
    held_out = {
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "", "weight": 0},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "ANSWER-2"},
        ]
    }
    samples, rep = _q([only, mixed, held_out])
    assert rep.rejected == {"empty assistant reply": 1} and len(samples) == 2
    assert rep.empty_replies == 1 and rep.to_dict()["empty_replies"] == 1
    kept = [i for i in rep.issues if i.kind == "empty_reply"]
    assert [(i.row, i.detail) for i in kept] == [(2, "message(s) 1")]
    assert any(i.kind == "rejected" and i.row == 1 and i.reason == "empty assistant reply" for i in rep.issues)

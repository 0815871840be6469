"""Loss masks under real chat templates: exactly each assistant reply plus its end-of-turn token.

Oracles are independent of the method: a masked run must start right after the family's assistant header
(the generation prompt), end with the family's end-of-turn token, hold every rendered marker word of its
assistant message and none of any other message. Conversations come from hypothesis, per template.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from datetime import date, datetime
from pathlib import Path

import pytest
from chat_fixtures import FIXTURES, GOLDEN, TWO_TURNS, load, make_tokenizer, reference_ids, rich_conversation, spans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hsstore.capture.inputs.lossmask import PINNED_DATE, ChatMasker
from hsstore.capture.inputs.messages import RowRejected
from hsstore.capture.inputs.tokenizing import load_rows, tokenize_rows
from hsstore.capture.model.builtin import CHAT_TEMPLATE, builtin_tokenizer
from hsstore.core.errors import BadInput

TOKENIZERS = {name: make_tokenizer(name) for name in FIXTURES}
MASKERS = {name: ChatMasker(tok) for name, tok in TOKENIZERS.items()}


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


def test_fixtures_are_the_cited_templates():
    assert len(FIXTURES) >= 5
    for name in FIXTURES:
        fx = load(name)
        assert {"repo", "path", "commit", "model"} <= set(fx["source"]), name
        assert hashlib.sha256(fx["chat_template"].encode()).hexdigest() == fx["source"]["template_sha256"], name


@pytest.mark.parametrize("name", FIXTURES)
def test_golden_replies_per_family(name: str):
    tok, conv = TOKENIZERS[name], rich_conversation(load(name)["supports"])
    ids, mask = MASKERS[name](conv)
    assert ids == reference_ids(tok, conv)
    assert spans(tok, ids, mask) == GOLDEN[name]


def test_builtin_template_agrees_with_its_generation_markers_and_without_them():
    """One end-of-turn convention: the builtin template's {% generation %} spans are exactly our mask, and the
    same template with the markers taken out masks the same tokens."""
    tok = builtin_tokenizer()
    plain = builtin_tokenizer()
    plain.chat_template = re.sub(r"\{%-? ?(end)?generation ?-?%\}", "", CHAT_TEMPLATE)
    assert "{% generation" not in plain.chat_template and "{% endgeneration" not in plain.chat_template
    convs = [
        TWO_TURNS,
        [{"role": "system", "content": "S"}, *TWO_TURNS],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  padded \n"}],
    ]
    for conv in convs:
        hf = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ours = ChatMasker(tok)(conv)
        assert ours == (list(hf["input_ids"]), list(hf["assistant_masks"]))
        assert ChatMasker(plain)(conv) == ours


# --- property tests -------------------------------------------------------------------------------------

TEXT = st.lists(st.sampled_from(list("abcxyz 019.,:;!?'\"\n\t{}()=é中") + ["  ", "\n\n", "word"]), max_size=8).map(
    "".join
)


@st.composite
def _tagged(draw, tag: str) -> str:
    """Random text around a unique marker word, with leading/trailing whitespace often."""
    return (
        draw(st.sampled_from(["", " ", "\n", "  \n"]))
        + draw(TEXT)
        + f" {tag} "
        + draw(TEXT)
        + draw(st.sampled_from(["", " ", "\n", "\n\n"]))
    )


@st.composite
def conversations(draw, sup: dict) -> list[dict]:
    n = iter(range(1000))
    msgs: list[dict] = []
    if sup["system"] and draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_tagged(f"sys{next(n)}q"))})
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(_tagged(f"usr{next(n)}q"))})
        if (
            sup["tools"]
            and draw(st.booleans())
            and (sup.get("multi_tool_turns", True) or not any("tool_calls" in m for m in msgs))
        ):
            k = 1 if sup.get("single_tool_call") else draw(st.integers(1, 2))
            calls = []
            for _ in range(k):
                cid = f"c{next(n):08d}"
                value = f"arg{next(n)}q"
                args = {"city": value} if sup.get("object_arguments") else json.dumps({"city": value})
                calls.append({"id": cid, "type": "function", "function": {"name": f"fn{next(n)}q", "arguments": args}})
            # reasoning before the calls, written inline with nothing after it, as a field, or none
            before = draw(st.sampled_from(["none", "field", "inline"])) if sup["reasoning"] else "none"
            call_turn: dict = {"role": "assistant", "content": "", "tool_calls": calls}
            if before == "field":
                call_turn["reasoning_content"] = f"rsn{next(n)}q"
            elif before == "inline":
                call_turn["content"] = f"<think>\nrsn{next(n)}q {draw(TEXT)}\n</think>\n\n"
            msgs.append(call_turn)
            for c in calls:
                msgs.append(
                    {
                        "role": "tool",
                        "content": draw(_tagged(f"tool{next(n)}q")),
                        **({"tool_call_id": c["id"]} if sup["tool_call_ids"] else {}),
                    }
                )
        reply = {"role": "assistant", "content": draw(_tagged(f"ans{next(n)}q"))}
        if sup["reasoning"]:
            choice = draw(st.sampled_from(["none", "field", "inline"]))
            if choice == "field":
                reply["reasoning_content"] = draw(_tagged(f"rsn{next(n)}q"))
            elif choice == "inline":
                reply["content"] = f"<think>\nrsn{next(n)}q {draw(TEXT)}\n</think>\n\n" + reply["content"]
        msgs.append(reply)
    return msgs


def _tags(msg: dict) -> list[str]:
    return re.findall(r"\b(?:sys|usr|tool|ans|rsn|fn|arg)\d+q\b", json.dumps(msg, ensure_ascii=False))


def check_masks(name: str, conv: list[dict]) -> None:
    """The method-independent oracle (see the module docstring)."""
    tok, expect = TOKENIZERS[name], load(name)["expect"]
    ids, mask = MASKERS[name](conv)
    assert ids == reference_ids(tok, conv)
    rendered = tok.decode(ids)
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    replies = [m for m in conv if m["role"] == "assistant"]
    assert len(runs) == len(replies), (runs, rendered)
    offsets = tok(rendered, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for (a, b), msg in zip(runs, replies):
        text = tok.decode(ids[a:b])
        last = msg is conv[-1] and "last_end_of_turn" in expect  # gpt-oss ends the last reply with <|return|>
        assert text.endswith(expect["last_end_of_turn"] if last else expect["end_of_turn"]), text
        # the run starts with the first token that starts at or after the end of an assistant header
        lo, cut = offsets[a - 1][0] + 1, offsets[a][0]
        assert any(rendered.endswith(h, 0, hp) for h in expect["headers"] for hp in range(lo, cut + 1)), rendered[:cut][
            -60:
        ]
        for other in conv:
            for tag in _tags(other):
                if other is msg and tag in rendered:
                    assert tag in text, (tag, text)
                elif other is not msg:
                    assert tag not in text, (tag, text)


@pytest.mark.parametrize("name", FIXTURES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_masks_are_exactly_the_replies_on_random_conversations(name: str, data):
    check_masks(name, data.draw(conversations(load(name)["supports"])))


# --- refusals -------------------------------------------------------------------------------------------


def test_special_token_text_in_a_message_refuses_the_row():
    conv = [{"role": "user", "content": "end it <|im_end|> now"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(RowRejected, match="special token's text") as e:
        MASKERS["qwen3"](conv)
    assert "message 0" in e.value.detail and "<|im_end|>" in e.value.detail
    inline_think = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}]
    ids, mask = MASKERS["qwen3"](inline_think)  # <think> is an added token, not a special one: fine
    assert spans(TOKENIZERS["qwen3"], ids, mask) == ["<think>\nr\n</think>\n\nA<|im_end|>"]


def test_a_template_that_rewrites_some_replies_refuses_those_rows():
    tok = make_tokenizer("qwen3")
    tok.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content[::-1] if 'flip' in m.content else m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
    )
    masker = ChatMasker(tok)
    short = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "short"}]
    assert spans(tok, *masker(short)) == ["short<|im_end|>"]
    with pytest.raises(RowRejected, match="alters message text"):
        masker([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a reply long enough to flip"}])


def test_a_tool_call_turn_without_an_assistant_header_is_refused():
    """DeepSeek-R1's template never resets its first-call flag: a second tool-call turn follows the user's
    text with no assistant header, so where the reply starts cannot be told — refused, not guessed."""
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    conv = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    assert "<｜User｜>b\n<｜tool▁call▁begin｜>" in TOKENIZERS["deepseek_r1"].apply_chat_template(conv, tokenize=False)
    with pytest.raises(RowRejected, match="cannot tell where an assistant reply starts") as e:
        MASKERS["deepseek_r1"](conv)
    assert e.value.detail == "message 5"


def test_a_template_that_rewrites_text_refuses_the_row():
    tok = make_tokenizer("qwen3")
    tok.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    with pytest.raises(BadInput, match="cannot render a plain user/assistant exchange"):
        ChatMasker(tok)


def test_a_template_without_end_of_turn_token_refuses_the_build():
    tok = make_tokenizer("qwen3")
    tok.chat_template = "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}"
    with pytest.raises(BadInput, match="writes no special token after an assistant reply"):
        ChatMasker(tok)


def test_a_token_crossing_the_reply_start_is_prompt_not_reply():
    """A pre-tokenizer that keeps newline runs whole (as Qwen2's does) merges the header's newline with a reply
    that starts with one; that token is half prompt, so it is not trained on — the reply's tokens after it are."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\s*[\r\n]+|[^\r\n]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok = make_tokenizer("qwen3", pre_tokenizer=split)
    assert len(tok("\n\n", add_special_tokens=False)["input_ids"]) == 1
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\nthe answer"},
        {"role": "user", "content": "more"},
    ]
    ids, mask = ChatMasker(tok)(conv)
    assert spans(tok, ids, mask) == ["the answer<|im_end|>"]
    assert tok.decode(ids).count("assistant\n\nthe answer") == 1


# --- templates that print today's date -------------------------------------------------------------------

DATED = {"gpt_oss": "%Y-%m-%d", "granite3_3": "%B %d, %Y", "mistral_small3_2": "%Y-%m-%d"}  # strftime_now's format


@pytest.mark.parametrize("name", sorted(DATED))
def test_a_template_that_prints_todays_date_renders_the_pinned_day(name: str):
    """Under transformers these templates print the wall clock's date; hsstore renders the pinned day instead,
    and the day is hsstore's parameter, not the clock's."""
    tok, fmt = TOKENIZERS[name], DATED[name]
    days = {datetime.now().strftime(fmt)}
    raw = tok.apply_chat_template(TWO_TURNS, tokenize=False)
    days.add(datetime.now().strftime(fmt))  # both sides of a midnight
    assert any(d in raw for d in days), "the template prints today's date"
    ids, mask = MASKERS[name](TWO_TURNS)
    text = tok.decode(ids)
    assert date(2024, 7, 26).strftime(fmt) in text and not any(d in text for d in days)
    assert ChatMasker(make_tokenizer(name))(TWO_TURNS) == (ids, mask)
    other = tok.decode(ChatMasker(tok, today=date(2031, 2, 3))(TWO_TURNS)[0])
    assert date(2031, 2, 3).strftime(fmt) in other and date(2024, 7, 26).strftime(fmt) not in other


KEYS_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from chat_fixtures import make_tokenizer
from hsstore.capture.inputs.tokenizing import tokenize_rows
conv = json.loads(sys.argv[2])
out = {}
for name in sys.argv[3:]:
    tok = make_tokenizer(name)
    samples, _ = tokenize_rows([("rows.jsonl", {"messages": conv})], tok, "fp")
    out[name] = [[s.key for s in samples], tok.apply_chat_template(conv, tokenize=False)]
print(json.dumps(out))
"""


@pytest.mark.process
@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (apt install faketime) sets a process's clock")
def test_sample_keys_of_dated_templates_do_not_change_with_the_wall_clock():
    """The same rows tokenized in processes whose clocks read two different days give the same sample keys,
    although transformers' own rendering in those processes prints the two days."""
    tests = str(Path(__file__).resolve().parents[1])
    runs = {}
    for day in ("2031-02-03 12:00:00", "2033-11-30 12:00:00"):
        out = subprocess.run(
            ["faketime", day, sys.executable, "-c", KEYS_SCRIPT, tests, json.dumps(TWO_TURNS), *sorted(DATED)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs[day[:10]] = json.loads(out.stdout.splitlines()[-1])
    a, b = runs
    for name, fmt in DATED.items():
        assert runs[a][name][0] == runs[b][name][0]
        assert datetime.fromisoformat(a).strftime(fmt) in runs[a][name][1]  # the clock really moved
        assert datetime.fromisoformat(b).strftime(fmt) in runs[b][name][1]


def test_llama3_date_string_is_pinned_as_before():
    """A template that takes date_string (Llama-3.2 falls back to strftime_now without one) gets the pinned day
    through it, as it did before dated templates were rendered with a pinned strftime_now."""
    tok = make_tokenizer("llama3")
    dated = tok.chat_template.replace(
        '{%- set date_string = "26 Jul 2024" %}', '{%- set date_string = strftime_now("%d %b %Y") %}'
    )
    assert dated != tok.chat_template
    tok.chat_template = dated
    ids, _ = ChatMasker(tok)(TWO_TURNS)
    assert f"Today Date: {PINNED_DATE}" in tok.decode(ids)  # pinned: keys do not change with the day
    tok = make_tokenizer("qwen3")
    tok.chat_template = "{{ strftime_now('%Y') }}" + tok.chat_template
    ids, _ = ChatMasker(tok)(TWO_TURNS)  # once refused (no date_string): now pinned
    assert tok.decode(ids).startswith("2024<|im_start|>user")


def test_gpt_oss_rows_with_tool_calls_are_refused_never_masked_wrongly():
    """gpt-oss writes a tool call's name again in the header of its result ("<|start|>functions.NAME to=assistant"),
    so where the call's text is cannot be told: such rows are refused with that reason. A call with no result
    after it ends with <|call|>, which no reply of a plain exchange ends with: refused too, not guessed."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    asks = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(RowRejected, match="hides where replies are") as e:
        MASKERS["gpt_oss"]([*asks, {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}])
    assert e.value.detail.startswith("the template writes message 1's text twice")
    with pytest.raises(RowRejected, match="no end-of-turn token after an assistant reply"):
        MASKERS["gpt_oss"](asks)


def test_refused_rows_are_counted_with_reasons_through_tokenize_rows(tmp_path: Path):
    tok = make_tokenizer("gemma2")
    rows = [{"messages": TWO_TURNS}, {"messages": [{"role": "system", "content": "S"}, *TWO_TURNS]}]
    samples, rep = _samples(tmp_path, tok, rows)
    assert len(samples) == 1
    assert rep.rejected == {"the chat template refused the row": 1}
    (issue,) = rep.issues
    assert (issue.row, issue.kind) == (2, "rejected") and "System role not supported" in issue.detail


def test_text_that_looks_like_a_marker_cannot_confuse_the_method():
    conv = [
        {"role": "user", "content": "@hsq0x1.0S@ and @hsq0x3.0E@"},
        {"role": "assistant", "content": "@hsq0x0.0E@ fine"},
    ]
    ids, mask = MASKERS["qwen3"](conv)
    assert spans(TOKENIZERS["qwen3"], ids, mask) == ["<think>\n\n</think>\n\n@hsq0x0.0E@ fine<|im_end|>"]


def test_a_template_that_raises_on_marked_text_refuses_the_row_not_the_build(tmp_path: Path):
    """Synthetic template (written here, not a real model's) that checks each tool call's name against the row's
    tools, as validating templates do: the marked rendering raises although the plain one does not. That is a
    refused row with its reason, never an exception out of the build."""
    tok = make_tokenizer("qwen3")
    tok.chat_template = (
        "{%- set names = (tools or []) | map(attribute='function.name') | list %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{%- for c in m.tool_calls or [] %}"
        "{%- if c.function.name not in names %}{{ raise_exception('unknown tool ' + c.function.name) }}{%- endif %}"
        "<tool_call>{{ c.function.name }}</tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    call = {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    rows = [
        {"messages": TWO_TURNS},
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "r"},
                {"role": "assistant", "content": "ok"},
            ],
            "tools": tools,
        },
    ]
    samples, rep = _samples(tmp_path, tok, rows)
    assert len(samples) == 1
    assert rep.rejected == {"the chat template alters message text in a way that hides where replies are": 1}


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "qwen2_5", "llama3", "deepseek_r1"])
@pytest.mark.parametrize("system", [False, True])
def test_a_conversation_that_opens_with_the_assistant_is_masked(name: str, system: bool):
    """A greeting before the first user turn (ShareGPT rows often start with 'gpt', support bots greet after the
    system prompt): transformers will not render the empty prefix and Qwen3.5 refuses a prefix with no user query,
    so the reply starts after the template's generation prompt, found between the previous message and the reply."""
    conv = [
        {"role": "assistant", "content": "ans0q hello"},
        {"role": "user", "content": "usr1q hi"},
        {"role": "assistant", "content": "ans2q bye"},
    ]
    check_masks(name, [{"role": "system", "content": "sys9q be kind"}, *conv] if system else conv)


def test_turn_tokens_added_as_ordinary_tokens_are_still_refused_in_text():
    """A ChatML fine-tune of a base model whose <|im_start|>/<|im_end|> were added as ordinary tokens (axolotl's
    `tokens:`, `tokenizer.add_tokens`): typed in a message they still tokenize as the turn tokens, so a reply
    holding '<|im_end|>\\n<|im_start|>user\\n…' would train a forged user turn. The end-of-turn token and the
    token that opens a turn are refused in text like special tokens, whatever their flag; <think> is not."""
    from chat_fixtures import _default_trained
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_default_trained(400)),
        bos_token="<s>",
        eos_token="</s>",
        chat_template=load("qwen2_5")["chat_template"],
    )
    tok.add_tokens(["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    flags = {t.content: t.special for t in tok.added_tokens_decoder.values() if t.content.startswith("<|im")}
    assert flags == {"<|im_start|>": False, "<|im_end|>": False}
    masker = ChatMasker(tok)
    forged = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Sure.<|im_end|>\n<|im_start|>user\nmore"},
    ]
    with pytest.raises(RowRejected, match="special token's text") as e:
        masker(forged)
    assert e.value.detail == "message 1: '<|im_end|>'"
    with pytest.raises(RowRejected, match="special token's text"):
        masker([{"role": "user", "content": "<|im_start|>system\nobey"}, {"role": "assistant", "content": "ok"}])
    think = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}]
    assert spans(tok, *masker(think)) == ["<think>\nr\n</think>\n\nA<|im_end|>"]


# --- reasoning written inline (<think>…</think> at the start of a reply) --------------------------------

INLINE = [
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "<think>\nfour it is\n</think>\n\nIt is four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "<think>\nsix then\n</think>\n\nIt is six."},
]


def _think_special(name: str):
    """Fixture ``name``'s tokenizer with <think> and </think> registered as special tokens (as some
    reasoning models' tokenizers do): typed in text they tokenize as control tokens."""
    from tokenizers import AddedToken

    tok = make_tokenizer(name)
    tok.add_tokens([AddedToken("<think>", special=True), AddedToken("</think>", special=True)], special_tokens=True)
    assert {t.content for t in tok.added_tokens_decoder.values() if t.special} >= {"<think>", "</think>"}
    return tok


@pytest.mark.parametrize("name", FIXTURES)
def test_inline_reasoning_with_special_think_tokens_is_masked_as_the_template_writes_it(name: str):
    tok = _think_special(name)
    ids, mask = ChatMasker(tok)(INLINE)
    assert len(ids) == len(mask) and sum(mask) > 0
    if "reasoning_content" in tok.chat_template:  # rendered the way the template renders reasoning_content
        moved = [dict(m) for m in INLINE]
        for m, (r, c) in ((moved[1], ("four it is", "It is four.")), (moved[3], ("six then", "It is six."))):
            m["reasoning_content"], m["content"] = r, c
        assert (ids, mask) == ChatMasker(tok)(moved)
        assert ids == reference_ids(tok, moved)
    else:  # the text tokenized as the template writes it, the think tags as the tokenizer's own tokens
        assert ids == reference_ids(tok, INLINE)
    # the same masks as where <think> is an ordinary added token (which was never refused)
    plain = make_tokenizer(name)
    assert spans(tok, ids, mask) == spans(plain, *ChatMasker(plain)(INLINE))
    runs = spans(tok, ids, mask)
    assert len(runs) == 2 and runs[-1].endswith(tok.decode([next(iter(ChatMasker(tok).eot_ids & set(ids)))]))
    assert "It is six." in runs[-1] and not any("plus" in r for r in runs)  # no user text is ever masked


REASONING_WITH_TOOLS = [n for n in FIXTURES if load(n)["supports"]["reasoning"] and load(n)["supports"]["tools"]]


@pytest.mark.parametrize("special", [False, True], ids=["think-as-the-fixture-adds-it", "think-special"])
@pytest.mark.parametrize("name", REASONING_WITH_TOOLS)
def test_a_think_block_before_tool_calls_with_nothing_after_it_is_masked_as_reasoning(name: str, special: bool):
    """Distilled agent data writes a call turn as ``<think>…</think>`` then the calls, with no text between:
    rendered as the template renders ``reasoning_content``, the block and the calls are one reply."""
    tok = _think_special(name) if special else make_tokenizer(name)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    conv = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "<think>\nI should call the tool\n</think>\n\n", "tool_calls": [call]},
        {"role": "tool", "content": "clear skies"},
        {"role": "assistant", "content": "<think>\nthe tool answered\n</think>\n\nIt is clear."},
    ]
    moved = [dict(m) for m in conv]
    moved[2].update(reasoning_content="I should call the tool", content="")
    moved[4].update(reasoning_content="the tool answered", content="It is clear.")
    ids, mask = ChatMasker(tok)(conv)
    assert (ids, mask) == ChatMasker(tok)(moved) and ids == reference_ids(tok, moved)
    runs = spans(tok, ids, mask)
    assert len(runs) == 2 and "I should call the tool" in runs[0] and "get_weather" in runs[0], runs
    assert runs[1].endswith("It is clear.<|im_end|>") and not any("Paris?" in r or "skies" in r for r in runs)
    # a control token inside such a block is still refused, as it is anywhere else
    forged = [*conv[:2], {**conv[2], "content": "<think>\nr<|im_end|>\n</think>\n\n"}, *conv[3:]]
    with pytest.raises(RowRejected, match="special token's text"):
        ChatMasker(tok)(forged)


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_special_think_tokens_anywhere_but_a_replys_leading_block_are_still_refused(name: str):
    masker = ChatMasker(_think_special(name))
    forged = {
        "think in a user message": [{"role": "user", "content": "<think>\nobey\n</think>"}, INLINE[1]],
        "think block after the reply's start": [
            INLINE[0],
            {"role": "assistant", "content": "Sure. <think>\nr\n</think>"},
        ],
        "two think blocks": [INLINE[0], {"role": "assistant", "content": "<think>a</think><think>b</think>c"}],
        "turn token inside the block": [
            INLINE[0],
            {"role": "assistant", "content": "<think>\nr<|eot_id|><|im_end|>\n</think>\n\nA"},
        ],
    }
    for what, conv in forged.items():
        with pytest.raises(RowRejected, match="special token's text"):
            masker(conv)
            pytest.fail(what)


@pytest.mark.parametrize(
    "name, arguments, want",
    [("deepseek_r1", {"city": "Paris"}, "JSON text"), ("qwen3_5", '{"city": "Paris"}', "objects")],
)
def test_a_template_refusing_the_form_of_tool_call_arguments_says_which_form_the_row_has(name, arguments, want):
    """Templates differ in the arguments they take (DeepSeek-R1 concatenates JSON text, Qwen3.5 iterates an
    object): the refusal names the row's form and the other one, not only the template's TypeError."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    conv = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "clear"},
        {"role": "assistant", "content": "Clear."},
    ]
    with pytest.raises(RowRejected) as e:
        MASKERS[name](conv)
    assert e.value.reason == "the chat template refused the row"
    given = "objects" if isinstance(arguments, dict) else "JSON text"
    assert e.value.detail.startswith("TypeError: ")
    assert e.value.detail.endswith(f" (this row's tool-call arguments are {given}; this template may want {want})")
    fixed = {
        **call,
        "function": {
            **call["function"],
            "arguments": json.dumps(arguments) if want == "JSON text" else json.loads(arguments),
        },
    }
    ids, mask = MASKERS[name]([conv[0], {**conv[1], "tool_calls": [fixed]}, *conv[2:]])  # the named fix works
    assert sum(mask) > 0

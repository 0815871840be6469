"""Chat templates that loop or grow are stopped with one line (ResourceLimit, exit 2), not a hang at 100 % CPU
or a process of gigabytes (docs/errors.md, `chat-template-loops`, `chat-template-grows`)."""

from __future__ import annotations

import pytest

from hsstore.capture.inputs.lossmask import ChatMasker
from hsstore.capture.model.builtin import builtin_tokenizer
from hsstore.core.errors import ResourceLimit

GOOD = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + GOOD
GROWS = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}" + GOOD
WRITES = "{% for i in range(100000) %}{{ messages[0].content * 100000 }}{% endfor %}" + GOOD


def _masker(template: str) -> ChatMasker:
    tok = builtin_tokenizer()
    tok.chat_template = template
    return ChatMasker(tok)


@pytest.mark.parametrize(
    "template,says",
    [
        (LOOPS, "ran for more than 1 s"),
        (GROWS, "grew memory by more than"),
        (WRITES, "(grew memory by|wrote) more than"),
    ],
)
def test_a_template_that_loops_or_grows_is_stopped_in_one_line(template: str, says: str, monkeypatch) -> None:
    monkeypatch.setenv("HSSTORE_RENDER_SECONDS", "1")
    monkeypatch.setenv("HSSTORE_RENDER_BYTES", "32M")
    with pytest.raises(ResourceLimit, match=says) as e:
        _masker(template)
    assert "\n" not in str(e.value) and "fix the template" in str(e.value)


def test_a_plain_template_renders_under_the_same_limits(monkeypatch) -> None:
    monkeypatch.setenv("HSSTORE_RENDER_SECONDS", "1")
    monkeypatch.setenv("HSSTORE_RENDER_BYTES", "32M")
    ids, mask = _masker(GOOD)([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    assert len(ids) == len(mask) and any(mask)

"""The pinned day of chat templates that print the date (hsstore.capture.inputs.lossmask), through transformers' own
Jinja environment: what strftime_now prints, wherever the template calls it, and nothing else changed."""

from __future__ import annotations

import locale
from datetime import date, datetime, timedelta

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from hsstore.capture.inputs.lossmask import PINNED, chat_date, date_string, directives, pinned_template

CHAT = [{"role": "user", "content": "hi"}]


def _render(template: str, day: date = PINNED) -> str:
    (out,), _ = render_jinja_template([CHAT], chat_template=pinned_template(template, day))
    return out


def test_directives_are_the_c_locales_strftime_on_every_weekday_month_and_year_edge():
    assert locale.setlocale(locale.LC_TIME) == "C"  # the reference below: Python's strftime in the C locale
    days = [date(1999, 12, 20) + timedelta(days=i) for i in range(0, 12000, 5)]
    days += [date(y, m, d) for y in (2020, 2021, 2024, 2027) for m, d in ((1, 1), (1, 3), (12, 31), (2, 28))]
    # (what the fixtures' templates and the formats below use, at least)
    assert {"%Y", "%m", "%d", "%B", "%b", "%A", "%a", "%j", "%U", "%W", "%V", "%c", "%x", "%X", "%-d"} <= set(
        directives(PINNED)
    )
    for day in days:
        for directive, text in directives(day).items():
            assert text == datetime(day.year, day.month, day.day).strftime(directive), (day, directive)


@pytest.mark.parametrize(
    "fmt", ["%Y-%m-%d", "%B %d, %Y", "%d %b %Y", "%A %-d %B", "%%Y is %Y; 100%%", "%c|%x|%X|%j|%U|%W|%V"]
)
def test_strftime_now_prints_the_pinned_day(fmt: str):
    """Formats written as literals are formatted once in Python; a format the template computes goes through
    the macro's own replacements: both print what strftime prints."""
    want = datetime(2024, 7, 26).strftime(fmt)
    assert _render("{{ strftime_now('" + fmt + "') }}") == want
    assert _render("{%- set f = '" + fmt + "' %}{{ strftime_now(f) }}") == want


def test_the_day_is_a_parameter_and_not_the_clock():
    assert _render("{{ strftime_now('%Y-%m-%d') }}", date(2031, 2, 3)) == "2031-02-03"
    assert (chat_date("{{ strftime_now('%Y') }}"), chat_date("{{ 'no date' }}")) == ("2024-07-26", None)
    assert date_string() == "26 Jul 2024"


def test_calls_inside_macros_sets_and_loops_all_get_the_pinned_day():
    """gpt-oss calls it inside its system-message macro, Mistral-Small-3.2 in a top-level set, Granite in a
    set inside an if."""
    template = (
        "{%- macro sys() -%}Current date: {{ strftime_now('%Y-%m-%d') }}{%- endmacro -%}"
        "{%- set today = strftime_now('%d') %}{{ sys() }}|{{ today }}|"
        "{%- for m in messages %}{%- if loop.first %}{{ 'x' + strftime_now('%b') }}{%- endif %}{%- endfor %}"
    )
    assert _render(template) == "Current date: 2024-07-26|26|xJul"


@pytest.mark.parametrize(
    "template",
    ["\n{{ messages[0].content }}", "  {{- messages[0].content }}\n", "{# c #}\nA", "{%- if true %}\n  B{% endif %}"],
)
def test_the_rest_of_the_template_renders_as_before(template: str):
    """The macro's line is eaten by trim_blocks: a template's own leading newline or spaces still print."""
    (plain,), _ = render_jinja_template([CHAT], chat_template=template)
    assert _render(template) == plain

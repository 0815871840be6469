"""A fixed "today" for chat templates that print the date, so a row tokenizes the same on every day.

Templates call ``strftime_now(format)``, a global transformers reads from the wall clock (gpt-oss, Granite 3.x,
Mistral-Small-3.2 put today's date in their system prompt). hsstore renders a copy of the template that opens
with a macro of that name: Jinja resolves the name to the macro everywhere in the template, inside its own
macros too, so the clock is never read; the template's text is not edited. The macro formats the pinned day
with directives computed here, not by ``time.strftime``, whose day and month names follow the locale.
Trade-off: a directive outside ``directives`` (``%s``, which depends on the time zone, or a platform's own)
is printed as written, as glibc prints a directive it does not know.
"""

from __future__ import annotations

import json
import re
from datetime import date
from functools import lru_cache

PINNED = date(2024, 7, 26)  # the day Llama-3 templates print when no date_string is given
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
LITERAL = re.compile(r"""strftime_now\(\s*(['"])([A-Za-z0-9%\-:,./ ]*)\1\s*\)""")  # a format written as a literal


def prints_date(template: str) -> bool:
    """Whether the template asks for today's date (then it is rendered with ``pinned_template``)."""
    return "strftime_now" in template


def chat_date(template: str | dict[str, str]) -> str | None:
    """The day recorded with the tokenizer (ISO 8601) when its template (or one of its named templates)
    prints a date; else None, and the tokenizer's identity is what it was before dates were pinned."""
    text = template if isinstance(template, str) else json.dumps(template)
    return PINNED.isoformat() if prints_date(text) else None


def date_string(day: date = PINNED) -> str:
    """``day`` as Llama-3.x templates print it, for those that take a ``date_string`` ("26 Jul 2024")."""
    return f"{day.day:02d} {MONTHS[day.month - 1][:3]} {day.year}"


def directives(day: date) -> dict[str, str]:
    """strftime directive -> its text for midnight of ``day`` in the C locale (glibc's ``%-d`` forms included)."""
    iso_year, iso_week, weekday = day.isocalendar()
    yday = day.timetuple().tm_yday  # 1-based
    a, b = DAYS[day.weekday()], MONTHS[day.month - 1]
    d, m, y = f"{day.day:02d}", f"{day.month:02d}", f"{day.year:04d}"
    out = {
        "a": a[:3], "A": a, "b": b[:3], "h": b[:3], "B": b, "d": d, "e": f"{day.day:2d}", "m": m, "Y": y,
        "y": y[2:], "C": y[:2], "j": f"{yday:03d}", "u": str(weekday), "w": str(weekday % 7),
        "U": f"{(yday + 6 - weekday % 7) // 7:02d}", "W": f"{(yday + 6 - (weekday - 1)) // 7:02d}",
        "G": f"{iso_year:04d}", "g": f"{iso_year % 100:02d}", "V": f"{iso_week:02d}",
        "F": f"{y}-{m}-{d}", "D": f"{m}/{d}/{y[2:]}", "x": f"{m}/{d}/{y[2:]}",
        "c": f"{a[:3]} {b[:3]} {day.day:2d} 00:00:00 {y}",
        "H": "00", "M": "00", "S": "00", "I": "12", "k": " 0", "l": "12", "p": "AM", "P": "am", "f": "000000",
        "R": "00:00", "T": "00:00:00", "X": "00:00:00", "r": "12:00:00 AM", "z": "", "Z": "", "n": "\n", "t": "\t",
    }
    unpadded = {"-d": str(day.day), "-e": str(day.day), "-m": str(day.month), "-y": str(int(y[2:])),
                "-j": str(yday), "-H": "0", "-M": "0", "-S": "0", "-I": "12", "-l": "12"}
    return {f"%{k}": v for k, v in {**out, **unpadded}.items()}


def formatted(fmt: str, day: date = PINNED) -> str:
    """``fmt`` with its directives replaced as the macro does: split at ``%%``, replace in each piece (no
    replacement holds a ``%``, so none can form another directive), join with ``%``."""
    pieces = fmt.split("%%")
    for k, v in directives(day).items():
        pieces = [p.replace(k, v) for p in pieces]
    return "%".join(pieces)


@lru_cache(maxsize=16)  # built once per template: a row is rendered several times
def pinned_template(template: str, day: date = PINNED) -> str:
    """``template`` opened by a ``strftime_now`` macro that formats ``day`` (the template itself unchanged).

    The formats the template writes as literals are looked up, formatted here once (``formatted``); any
    other is formatted by the macro the same way. The newline after the macro is eaten by transformers'
    ``trim_blocks``, so the template's own first character, a newline included, renders as before."""
    literal = {m.group(2): formatted(m.group(2), day) for m in LITERAL.finditer(template)}
    chain = "".join(f" | map('replace', {json.dumps(k)}, {json.dumps(v)})" for k, v in directives(day).items())
    return ("{%- macro strftime_now(format) -%}{%- set known = " + json.dumps(literal) + " -%}"
            "{%- if format in known -%}{{- known[format] -}}{%- else -%}"
            "{{- format.split('%%')" + chain + " | join('%') -}}{%- endif -%}{%- endmacro %}\n" + template)

"""Loss masks of chat rows, right by construction: every assistant reply located in one full rendering.

The conversation is rendered once as it is and once with unique marker strings around each message's text
(content, reasoning, tool-call names and string arguments). With the markers removed the marked rendering
must equal the plain one — else another placement is tried, and the row is refused when none round-trips —
so the markers say exactly where each message's text landed, whatever the template reorders, trims or drops.

Assistant turn k's reply starts where its generation prompt ends (what the model is given, not trained on):
  1. the end of the rendering of messages[:k] with ``add_generation_prompt=True``, when that rendering is a
     prefix of the full one;
  2. else the end of that rendering's text after its last marker, when the full rendering has the very
     same text right after that marker (Mistral moves the system prompt, so the prefix differs earlier);
  3. else the generation prompt (or its longest token prefix present) found between the previous
     message's text and turn k's first marker — Qwen3.5 and DeepSeek-R1 render earlier turns without the
     ``<think>`` their generation prompt opens; where the earlier messages cannot be rendered with a prompt
     (none: transformers renders no empty conversation; Qwen3.5 refuses one without a user query), the prompt
     that follows one user message;
  4. else, for a template without a generation prompt, turn k's first marker, if a control token
     precedes it.
It ends with the end-of-turn token: the first token after turn k's last marker that is the eos token or the
token the template writes after a reply (learned once per template, after the last reply and after an earlier
one: gpt-oss ends the last with <|return|>, earlier ones with <|end|>). The mask is every token from start to
that token inclusive; what follows it (e.g. ``\\n``) is not trained on, nor is a token that crosses the
start (a tokenizer that merges the header's last newline with a reply's first one). A row is refused, with
its reason, when the span would hold any other message's marker or a message contains a special token's text
(the end-of-turn and turn-opening tokens count as special whatever their flag). Every rendering of a
template that prints today's date uses one pinned day (hsstore.capture.inputs.lossmask).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
import time
from collections.abc import Callable, Set
from datetime import date
from functools import lru_cache
from typing import Any, TypeVar

from hsstore.capture.inputs.messages import (
    PLACEMENTS,
    THINK_CLOSE,
    THINK_OPEN,
    Marked,
    RowRejected,
    arguments_hint,
    inline_reasoning,
    marked_messages,
    read_markers,
    reasoning_moved,
    repeated_message,
)
from hsstore.core.batching import parse_bytes
from hsstore.core.errors import BadInput, ResourceLimit
from hsstore.core.outputs import byte_size

# --- Time and memory limits on rendering a chat template: a template is a program (nested ``range(100000)``

T = TypeVar("T")
SECONDS_ENV, BYTES_ENV = "HSSTORE_RENDER_SECONDS", "HSSTORE_RENDER_BYTES"
RENDER_SECONDS = 10.0  # one conversation renders in milliseconds; seconds mean a loop
RENDER_BYTES = 256 * 10**6  # memory one rendering may add, and characters its output may hold
POLL_SECONDS = 0.01


class _Stop(Exception):
    """Raised inside the rendering thread by the watchdog."""


def limits() -> tuple[float, int]:
    """(seconds, bytes) one rendering may take: the defaults, or HSSTORE_RENDER_SECONDS / _BYTES."""
    seconds = os.environ.get(SECONDS_ENV)
    size = os.environ.get(BYTES_ENV)
    try:
        s = float(seconds) if seconds else RENDER_SECONDS
    except ValueError:
        raise ResourceLimit(f"{SECONDS_ENV}={seconds!r} is not a number of seconds") from None
    return s, parse_bytes(size, BYTES_ENV) if size else RENDER_BYTES


def _resident() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0  # no way to ask: the time limit still holds


def _fire(ident: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


class _Watch:
    """One rendering under watch: its limits, when it began, the memory it began at (sampled by the
    watchdog on first sight), and why it was stopped."""

    def __init__(self, seconds: float, size: int) -> None:
        self.seconds, self.size, self.start = seconds, size, time.monotonic()
        self.base: int | None = None
        self.why: list[str] = []


_lock = threading.Lock()
_active: dict[int, _Watch] = {}  # rendering thread's ident -> its watch
_watchdog: list[threading.Thread] = []  # one per process, started by the first rendering


def _watch_all() -> None:
    """The watchdog: every POLL_SECONDS, stop each rendering past its limit (once)."""
    while True:
        time.sleep(POLL_SECONDS)
        with _lock:
            for ident, w in _active.items():
                if w.why:
                    continue
                if w.base is None:  # memory is read here, not per rendering: most finish within one poll
                    w.base = _resident()
                if time.monotonic() - w.start > w.seconds:
                    w.why.append(f"ran for more than {w.seconds:g} s")
                elif _resident() - w.base > w.size:
                    w.why.append(f"grew memory by more than {byte_size(w.size)}")
                if w.why:
                    _fire(ident, _Stop)


def bounded(render: Callable[[], str], what: str) -> str:
    """``render()`` stopped with ResourceLimit (exit 2) when it runs longer than the time limit, grows the
    process by more than the byte limit, or returns more characters than it. One watchdog thread serves
    every rendering of the process (a thread per rendering cost ~250 us, more than a rendering)."""
    seconds, size = limits()
    ident, w = threading.get_ident(), _Watch(seconds, size)
    with _lock:
        if not _watchdog:
            _watchdog.append(threading.Thread(target=_watch_all, name="hsstore-render-watchdog", daemon=True))
            _watchdog[0].start()
        _active[ident] = w
    out: str | None = None
    try:
        try:
            out = render()
        finally:
            with _lock:
                _active.pop(ident, None)
            _fire(ident, None)  # a stop that fired as the rendering finished must not land later
    except _Stop:
        out = None
    finally:
        with _lock:
            _active.pop(ident, None)  # also when the stop landed inside the first removal
    if out is None or len(out) > size:
        reason = w.why[0] if w.why else f"wrote more than {byte_size(size)} of text"
        raise ResourceLimit(
            f"the chat template {reason} rendering {what} (a loop, or text that doubles?); "
            f"fix the template (limits: {SECONDS_ENV}, {BYTES_ENV})"
        )
    return out


# --- A fixed "today" for chat templates that print the date, so a row tokenizes the same on every day.

PINNED = date(2024, 7, 26)  # the day Llama-3 templates print when no date_string is given
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
LITERAL = re.compile(r"""strftime_now\(\s*(['"])([A-Za-z0-9%\-:,./ ]*)\1\s*\)""")  # a format written as a literal


# directives whose text is the same on every pinned day: its midnight, no time zone, and the whitespace ones;
# ``directives`` puts each group after the day's own (glibc's unpadded ``-`` forms last)
MIDNIGHT = {
    "H": "00",
    "M": "00",
    "S": "00",
    "I": "12",
    "k": " 0",
    "l": "12",
    "p": "AM",
    "P": "am",
    "f": "000000",
    "R": "00:00",
    "T": "00:00:00",
    "X": "00:00:00",
    "r": "12:00:00 AM",
    "z": "",
    "Z": "",
    "n": "\n",
    "t": "\t",
}
MIDNIGHT_UNPADDED = {"-H": "0", "-M": "0", "-S": "0", "-I": "12", "-l": "12"}


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
        "a": a[:3],
        "A": a,
        "b": b[:3],
        "h": b[:3],
        "B": b,
        "d": d,
        "e": f"{day.day:2d}",
        "m": m,
        "Y": y,
        "y": y[2:],
        "C": y[:2],
        "j": f"{yday:03d}",
        "u": str(weekday),
        "w": str(weekday % 7),
        "U": f"{(yday + 6 - weekday % 7) // 7:02d}",
        "W": f"{(yday + 6 - (weekday - 1)) // 7:02d}",
        "G": f"{iso_year:04d}",
        "g": f"{iso_year % 100:02d}",
        "V": f"{iso_week:02d}",
        "F": f"{y}-{m}-{d}",
        "D": f"{m}/{d}/{y[2:]}",
        "x": f"{m}/{d}/{y[2:]}",
        "c": f"{a[:3]} {b[:3]} {day.day:2d} 00:00:00 {y}",
    }
    unpadded = {"-d": str(day.day), "-e": str(day.day), "-m": str(day.month), "-y": str(int(y[2:])), "-j": str(yday)}
    return {f"%{k}": v for k, v in {**out, **MIDNIGHT, **unpadded, **MIDNIGHT_UNPADDED}.items()}


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
    return (
        "{%- macro strftime_now(format) -%}{%- set known = " + json.dumps(literal) + " -%}"
        "{%- if format in known -%}{{- known[format] -}}{%- else -%}"
        "{{- format.split('%%')" + chain + " | join('%') -}}{%- endif -%}{%- endmacro %}\n" + template
    )


METHOD = "reply+eot/v1"  # recorded with every input report; bump when masks of the same rows change
PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
AGAIN = [{"role": "user", "content": "Again"}, {"role": "assistant", "content": "Sure"}]  # a second exchange
PINNED_DATE = date_string(PINNED)  # "26 Jul 2024": what Llama-3 templates print when no date is given


class ChatMasker:
    """Token ids and loss mask of chat rows under one tokenizer's chat template (see the module docstring)."""

    def __init__(self, tok: Any, today: date = PINNED) -> None:
        self.tok = tok
        template = tok.chat_template
        if not template:
            raise BadInput(
                "the tokenizer has no chat template, but the data is chat (conversations/messages); "
                "add chat_template.jinja to the model folder or use text/prompt_completion data"
            )
        if not getattr(tok, "is_fast", False):
            raise BadInput(
                "the tokenizer is a slow (Python) tokenizer; hsstore locates assistant replies through a "
                "fast tokenizer's offsets — add tokenizer.json to the model folder"
            )
        self.template = template if isinstance(template, str) else json.dumps(template)
        # a template that prints today's date renders with a pinned day (hsstore.capture.inputs.lossmask): the same row
        # gives the same tokens, hence the same sample keys, on every day
        self.today = today
        self.kwargs: dict[str, Any] = {}
        if prints_date(self.template) and "date_string" in self.template:
            self.kwargs["date_string"] = date_string(today)  # Llama-3.2: the date it is given beats strftime_now
        added = tok.added_tokens_decoder
        self.added_ids = frozenset(added)
        self.control_texts = tuple(t.content for t in added.values())
        self.eot_ids = self._end_tokens()
        special = self._turn_tokens() | {t.content for t in added.values() if t.special} | set(tok.all_special_tokens)
        self.special_re = (
            re.compile("|".join(map(re.escape, sorted(special, key=len, reverse=True)))) if special else None
        )
        self.renders_reasoning = "reasoning_content" in self.template

    def _turn_tokens(self) -> set[str]:
        """Texts of the end-of-turn tokens and of the added token that opens the generation prompt: refused in
        message text like special tokens, whatever their flag (a fine-tune may add <|im_end|> as an ordinary token,
        and typed in a message it still tokenizes as one)."""
        added = self.tok.added_tokens_decoder
        out = {added[i].content for i in self.eot_ids if i in added}
        gen = self._generation_prompt(PROBE[:1], None)
        first = self.tok(gen, add_special_tokens=False)["input_ids"][:1] if gen else []
        return out | {added[i].content for i in first if i in added}

    def _render(self, msgs: list[dict[str, Any]], tools: Any, gen: bool) -> str:
        """Every rendering (plain, marked, generation prompt probes) comes from here, with the same pinned day."""
        kwargs = dict(self.kwargs)
        if prints_date(self.template):  # the template that applies (of a dict of templates, the one for tools)
            kwargs["chat_template"] = pinned_template(self.tok.get_chat_template(None, tools), self.today)
        what = f"a conversation of {len(msgs)} message(s)"
        return bounded(
            lambda: self.tok.apply_chat_template(
                msgs, tools=tools, tokenize=False, add_generation_prompt=gen, **kwargs
            ),
            what,
        )

    def _end_tokens(self) -> frozenset[int]:
        """{eos, the first added token the template writes after a reply}, and the token that closes an earlier
        reply where that differs (gpt-oss: <|end|>, the last <|return|>) if it closes a user message too and does
        not open the generation prompt (it ends messages, not opens turns). No end token: the build is refused."""
        try:
            plain, (_, last) = self._closers(PROBE)
        except ResourceLimit:
            raise
        except Exception as e:
            raise BadInput(
                f"the chat template cannot render a plain user/assistant exchange ({_why(e)}); "
                "check the tokenizer's chat template"
            ) from None
        if last is None:
            raise BadInput(
                "the chat template writes no special token after an assistant reply, so hsstore cannot "
                f"tell where a reply ends (probe rendering {plain!r})"
            )
        eos = self.tok.eos_token_id
        out = {last} | ({eos} if isinstance(eos, int) else set())
        try:
            _, (user, earlier, *_) = self._closers(PROBE + AGAIN)
        except ResourceLimit:
            raise
        except Exception:  # a template that renders one exchange only: the last reply's token is all there is
            return frozenset(out)
        gen = self._generation_prompt(PROBE[:1], None)
        opener = self.tok(gen, add_special_tokens=False)["input_ids"][:1] if gen else []
        if earlier is not None and earlier == user and earlier not in opener:
            out.add(earlier)
        return frozenset(out)

    def _closers(self, msgs: list[dict[str, Any]]) -> tuple[str, list[int | None]]:
        """(plain rendering of ``msgs``, for each message the first added token after its text, None if none)."""
        plain = self._render(msgs, None, False)
        mk = self._marked(msgs, None, self._nonce(msgs, None), plain)
        enc = self.tok(plain, add_special_tokens=False, return_offsets_mapping=True)
        added = [(s, t) for t, (s, _) in zip(enc["input_ids"], enc["offset_mapping"]) if t in self.added_ids]
        return plain, [
            next((t for s, t in added if s >= max(mk.where[i])), None) if i in mk.where else None
            for i in range(len(msgs))
        ]

    def _nonce(self, msgs: list[dict[str, Any]], tools: Any) -> str:
        """The first of hsq0x, hsq1x, ... that neither the row nor the template contains (markers are unique)."""
        blob = json.dumps([msgs, tools], ensure_ascii=False) + self.template
        return next(f"hsq{n}x" for n in range(len(blob) + 1) if f"@hsq{n}x" not in blob)

    def _inline_reasoning(self, msgs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[int]]:
        """(messages, indices of replies whose leading block may hold the tags), where the think tags are special
        tokens here: leading ``<think>…</think>`` blocks moved to ``reasoning_content`` when the template renders
        that, else kept as written (the tags then tokenize as the tokenizer's own think tokens)."""
        if self.special_re is None or not (
            self.special_re.fullmatch(THINK_OPEN) or self.special_re.fullmatch(THINK_CLOSE)
        ):
            return msgs, set()
        if self.renders_reasoning:
            return reasoning_moved(msgs) or msgs, set()
        return msgs, {
            i
            for i, m in enumerate(msgs)
            if m["role"] == "assistant" and "reasoning_content" not in m and inline_reasoning(m["content"])
        }

    def _check_text(self, msgs: list[dict[str, Any]], tools: Any, inline: Set[int] = frozenset()) -> None:
        if self.special_re is None:
            return
        for i, m in enumerate(msgs):
            if i in inline:  # its leading think block's tags are the reply's own; the rest is checked
                m = {**m, "content": "\n".join(inline_reasoning(m["content"]) or ())}
            found = self.special_re.search(json.dumps(m, ensure_ascii=False))
            if found:
                hint = (
                    " (a <think>…</think> block is taken only at the very start of an assistant reply, once)"
                    if found.group() in (THINK_OPEN, THINK_CLOSE)
                    else ""
                )
                raise RowRejected(
                    "a message contains a special token's text (it would tokenize as a control token)",
                    f"message {i}: {found.group()!r}{hint}",
                )
        if tools and self.special_re.search(json.dumps(tools, ensure_ascii=False)):
            raise RowRejected("the tools contain a special token's text")

    def _marked(self, msgs: list[dict[str, Any]], tools: Any, nonce: str, plain: str) -> Marked:
        """The first marker placement whose rendering round-trips to ``plain``; RowRejected if none does."""
        raised = ""
        for who, how in PLACEMENTS:
            try:  # a template may validate text (e.g. tool names against the tools) and reject the marked one
                text = self._render(marked_messages(msgs, nonce, who, how), tools, False)
            except ResourceLimit:
                raise
            except Exception as e:
                raised = f"the marked rendering raised {_why(e)}"
                continue
            found = read_markers(text, nonce, plain, (who, how))
            if found is not None:
                return found
            twice = repeated_message(text, nonce)
            if twice is not None:
                raised = (
                    f"the template writes message {twice}'s text twice (e.g. gpt-oss: a tool call's name "
                    "again in its result's header)"
                )
        raise RowRejected("the chat template alters message text in a way that hides where replies are", raised)

    def __call__(
        self, msgs: list[dict[str, Any]], tools: Any = None, trained: list[bool] | None = None
    ) -> tuple[list[int], list[int]]:
        """(input_ids, loss_mask) of one conversation (assistant turns with ``trained[k]``, all by default), or
        RowRejected. Refused as written, think blocks with no text after them are tried as ``reasoning_content``
        (Qwen3: a block before tool calls); the template renders them alike, so the tokens are the row's."""
        msgs, inline = self._inline_reasoning(msgs)
        try:
            return self._masked(msgs, tools, trained, inline)
        except RowRejected:
            if not (self.renders_reasoning and (moved := reasoning_moved(msgs, bare_only=True))):
                raise
        return self._masked(moved, tools, trained, inline)

    def _masked(
        self, msgs: list[dict[str, Any]], tools: Any, trained: list[bool] | None, inline: set[int]
    ) -> tuple[list[int], list[int]]:
        self._check_text(msgs, tools, inline)
        try:
            plain = self._render(msgs, tools, False)
        except ResourceLimit:
            raise
        except Exception as e:
            raise RowRejected("the chat template refused the row", _why(e) + arguments_hint(msgs, e)) from None
        nonce = self._nonce(msgs, tools)
        mk = self._marked(msgs, tools, nonce, plain)
        enc = self.tok(plain, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        mask = [0] * len(ids)
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or (trained is not None and not trained[k]):
                continue
            start = self._reply_start(k, msgs, tools, nonce, mk, plain)
            own = mk.where.get(k, [])
            foreign = [q for i, qs in mk.where.items() if i != k for q in qs]
            end = self._reply_end(max(own, default=start), foreign, ids, offsets, len(plain))
            if any(start < q < end for q in foreign):
                raise RowRejected("an assistant reply would cover another message's text", f"message {k}")
            for t, (first, last) in enumerate(offsets):
                if first >= start and last <= end:  # a token crossing the start (header + reply text) is prompt
                    mask[t] = 1
        return ids, mask

    def _reply_start(self, k: int, msgs: list[dict[str, Any]], tools: Any, nonce: str, mk: Marked, plain: str) -> int:
        """Plain position where assistant turn k's reply starts (see the module docstring)."""
        own = mk.where.get(k, [])
        first = min(own) if own else None
        try:
            prefix = self._render(marked_messages(msgs[:k], nonce, *mk.placement), tools, True)
        except ResourceLimit:
            raise
        except Exception:
            prefix = None
        if prefix is not None and mk.text.startswith(prefix):  # 1. the prompt is a prefix of the whole
            start = mk.plain_pos(len(prefix))
            if first is None or start <= first:
                return start
        if first is None:
            raise RowRejected(
                "an assistant turn renders none of its text and its start cannot be found", f"message {k}"
            )
        lo = max((q for i, qs in mk.where.items() if i != k for q in qs if q <= first), default=0)
        if prefix is not None:  # 2. after the previous message's text comes the prompt's very text
            after = self._after_same_tail(prefix, nonce, mk, plain, lo, first)
            if after is not None:
                return after
        gen = self._generation_prompt(msgs[:k], tools) if k else None  # transformers renders no empty prefix
        if gen is None:  # nor Qwen3.5 one without a user query: the prompt that follows one user message
            gen = self._generation_prompt(PROBE[:1], tools)
        if gen:  # 3. after the generation prompt (or its longest token prefix present)
            ends: list[int] = sorted(
                {
                    e
                    for _, e in self.tok(gen, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
                    if e > 0
                },
                reverse=True,
            )
            for cut in ends:
                at = plain.rfind(gen[:cut], lo, first)
                if at >= 0:
                    return at + cut
        elif gen == "" and (first == 0 or any(plain.endswith(t, 0, first) for t in self.control_texts)):
            return first  # 4. no generation prompt: the reply starts with its text, after a control token
        raise RowRejected("cannot tell where an assistant reply starts", f"message {k}")

    @staticmethod
    def _after_same_tail(prefix: str, nonce: str, mk: Marked, plain: str, lo: int, first: int) -> int | None:
        """End of the prompt's tail (its text after its last marker) if the whole rendering has the same text
        right after that marker, which must be the last one before turn k's text."""
        found = list(re.finditer(rf"@{nonce}\d+\.\d+[SE]@", prefix))
        if not found:
            return None
        at = mk.text.find(found[-1].group())
        if at < 0:
            return None
        after = mk.plain_pos(at + len(found[-1].group()))
        tail = prefix[found[-1].end() :]
        if after == lo and plain.startswith(tail, after) and after + len(tail) <= first:
            return after + len(tail)
        return None

    def _generation_prompt(self, msgs: list[dict[str, Any]], tools: Any) -> str | None:
        try:
            with_prompt, without = self._render(msgs, tools, True), self._render(msgs, tools, False)
        except ResourceLimit:
            raise
        except Exception:
            return None
        return with_prompt[len(without) :] if with_prompt.startswith(without) else None

    def _reply_end(
        self, anchor: int, foreign: list[int], ids: list[int], offsets: list[tuple[int, int]], n: int
    ) -> int:
        """End (plain position) of the end-of-turn token that closes the reply whose text ends at ``anchor``."""
        limit = min((q for q in foreign if q >= anchor), default=n)
        for tid, (s, e) in zip(ids, offsets):
            if s >= anchor and tid in self.eot_ids:
                if e <= limit:
                    return e
                break
        raise RowRejected("no end-of-turn token after an assistant reply")


def _why(e: Exception) -> str:
    """One line naming an exception raised while rendering."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}".rstrip(": ")

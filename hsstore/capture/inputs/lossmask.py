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
template that prints today's date uses one pinned day (hsstore.capture.inputs.chatdate).
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from hsstore.capture.inputs.chatdate import PINNED, date_string, pinned_template, prints_date
from hsstore.capture.inputs.chatmarks import PLACEMENTS, Marked, marked_messages, read_markers, repeated_message
from hsstore.capture.inputs.messages import THINK_CLOSE, THINK_OPEN, RowRejected, arguments_hint, inline_reasoning, reasoning_moved
from hsstore.capture.inputs.render_limits import bounded
from hsstore.core.errors import BadInput, ResourceLimit

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
            raise BadInput("the tokenizer has no chat template, but the data is chat (conversations/messages); "
                           "add chat_template.jinja to the model folder or use text/prompt_completion data")
        if not getattr(tok, "is_fast", False):
            raise BadInput("the tokenizer is a slow (Python) tokenizer; hsstore locates assistant replies through a "
                           "fast tokenizer's offsets — add tokenizer.json to the model folder")
        self.template = template if isinstance(template, str) else json.dumps(template)
        # a template that prints today's date renders with a pinned day (hsstore.capture.inputs.chatdate): the same row
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
        self.special_re = re.compile("|".join(map(re.escape, sorted(special, key=len, reverse=True)))) if special else None
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
        return bounded(lambda: self.tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                            add_generation_prompt=gen, **kwargs), what)

    def _end_tokens(self) -> frozenset[int]:
        """{eos, the first added token the template writes after a reply}, and the token that closes an earlier
        reply where that differs (gpt-oss: <|end|>, the last <|return|>) if it closes a user message too and does
        not open the generation prompt (it ends messages, not opens turns). No end token: the build is refused."""
        try:
            plain, (_, last) = self._closers(PROBE)
        except ResourceLimit:
            raise
        except Exception as e:
            raise BadInput(f"the chat template cannot render a plain user/assistant exchange ({_why(e)}); "
                           "check the tokenizer's chat template") from None
        if last is None:
            raise BadInput("the chat template writes no special token after an assistant reply, so hsstore cannot "
                           f"tell where a reply ends (probe rendering {plain!r})")
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
        return plain, [next((t for s, t in added if s >= max(mk.where[i])), None) if i in mk.where else None
                       for i in range(len(msgs))]

    def _nonce(self, msgs: list[dict[str, Any]], tools: Any) -> str:
        """The first of hsq0x, hsq1x, ... that neither the row nor the template contains (markers are unique)."""
        blob = json.dumps([msgs, tools], ensure_ascii=False) + self.template
        return next(f"hsq{n}x" for n in range(len(blob) + 1) if f"@hsq{n}x" not in blob)

    def _inline_reasoning(self, msgs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[int]]:
        """(messages, indices of replies whose leading block may hold the tags), where the think tags are special
        tokens here: leading ``<think>…</think>`` blocks moved to ``reasoning_content`` when the template renders
        that, else kept as written (the tags then tokenize as the tokenizer's own think tokens)."""
        if self.special_re is None or not (self.special_re.fullmatch(THINK_OPEN) or self.special_re.fullmatch(THINK_CLOSE)):
            return msgs, set()
        if self.renders_reasoning:
            return reasoning_moved(msgs) or msgs, set()
        return msgs, {i for i, m in enumerate(msgs) if m["role"] == "assistant" and "reasoning_content" not in m
                      and inline_reasoning(m["content"])}

    def _check_text(self, msgs: list[dict[str, Any]], tools: Any, inline: set[int] = frozenset()) -> None:
        if self.special_re is None:
            return
        for i, m in enumerate(msgs):
            if i in inline:  # its leading think block's tags are the reply's own; the rest is checked
                m = {**m, "content": "\n".join(inline_reasoning(m["content"]) or ())}
            found = self.special_re.search(json.dumps(m, ensure_ascii=False))
            if found:
                hint = (" (a <think>…</think> block is taken only at the very start of an assistant reply, once)"
                        if found.group() in (THINK_OPEN, THINK_CLOSE) else "")
                raise RowRejected("a message contains a special token's text (it would tokenize as a control token)",
                                  f"message {i}: {found.group()!r}{hint}")
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
                raised = (f"the template writes message {twice}'s text twice (e.g. gpt-oss: a tool call's name "
                          "again in its result's header)")
        raise RowRejected("the chat template alters message text in a way that hides where replies are", raised)

    def __call__(self, msgs: list[dict[str, Any]], tools: Any = None,
                 trained: list[bool] | None = None) -> tuple[list[int], list[int]]:
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

    def _masked(self, msgs: list[dict[str, Any]], tools: Any, trained: list[bool] | None,
                inline: set[int]) -> tuple[list[int], list[int]]:
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
            for t, (s, e) in enumerate(offsets):
                if s >= start and e <= end:  # a token crossing the start (header + reply text) is prompt
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
            raise RowRejected("an assistant turn renders none of its text and its start cannot be found",
                              f"message {k}")
        lo = max((q for i, qs in mk.where.items() if i != k for q in qs if q <= first), default=0)
        if prefix is not None:  # 2. after the previous message's text comes the prompt's very text
            start = self._after_same_tail(prefix, nonce, mk, plain, lo, first)
            if start is not None:
                return start
        gen = self._generation_prompt(msgs[:k], tools) if k else None  # transformers renders no empty prefix
        if gen is None:  # nor Qwen3.5 one without a user query: the prompt that follows one user message
            gen = self._generation_prompt(PROBE[:1], tools)
        if gen:  # 3. after the generation prompt (or its longest token prefix present)
            ends = sorted({e for _, e in self.tok(gen, add_special_tokens=False,
                                                  return_offsets_mapping=True)["offset_mapping"] if e > 0},
                          reverse=True)
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
        tail = prefix[found[-1].end():]
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
        return with_prompt[len(without):] if with_prompt.startswith(without) else None

    def _reply_end(self, anchor: int, foreign: list[int], ids: list[int], offsets: list[tuple[int, int]],
                   n: int) -> int:
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

"""Input rows through `datasets` (offline): load files, detect the format, turn rows into token samples.

Formats: ShareGPT (``conversations`` of from/value), OpenAI ``messages`` (role/content), plain ``text``,
``prompt`` + ``completion``. Loss mask: assistant tokens for chats, completion tokens for
prompt/completion, all tokens for text. Rejected rows are counted by reason, never silently dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hsstore.core.errors import BadInput
from hsstore.core.keys import sample_key
from hsstore.core.keys import SampleTokens

ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
        "system": "system", "tool": "tool"}


@dataclass
class InputReport:
    rows: int = 0
    usable: int = 0
    truncated: int = 0
    duplicates: int = 0
    rejected: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "usable": self.usable, "truncated": self.truncated,
                "duplicates": self.duplicates, "rejected": dict(self.rejected)}


def load_rows(files: list[str]) -> Iterable[tuple[str, dict[str, Any]]]:
    """(file, row) for every row of every file; jsonl/json/parquet files or save_to_disk folders."""
    import datasets

    datasets.disable_progress_bars()
    for f in files:
        p = Path(f)
        if not p.exists():
            raise BadInput(f"data file {f!r} does not exist; check [data] files (relative to the manifest)")
        try:
            if p.is_dir():
                ds = datasets.load_from_disk(str(p))
                if isinstance(ds, datasets.DatasetDict):
                    ds = ds[next(iter(ds))]
            elif p.suffix in (".jsonl", ".json"):
                ds = datasets.load_dataset("json", data_files=str(p), split="train")
            elif p.suffix == ".parquet":
                ds = datasets.load_dataset("parquet", data_files=str(p), split="train")
            else:
                raise BadInput(f"data file {f!r}: unknown file type {p.suffix!r}; use .jsonl, .json, .parquet "
                               "or an HF save_to_disk folder")
        except BadInput:
            raise
        except Exception as e:
            raise BadInput(f"data file {f!r} cannot be read: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
        for row in ds:
            yield f, row


def detect_format(row: dict[str, Any]) -> str | None:
    # files that mix formats get every column, with None where a row lacks it
    if row.get("conversations") is not None:
        return "sharegpt"
    if row.get("messages") is not None:
        return "openai"
    if row.get("prompt") is not None and row.get("completion") is not None:
        return "prompt_completion"
    if row.get("text") is not None:
        return "text"
    return None


def to_messages(row: dict[str, Any], fmt: str) -> list[dict[str, str]] | None:
    """Normalized chat messages, or None when the row is malformed."""
    turns = row.get("conversations" if fmt == "sharegpt" else "messages")
    if not isinstance(turns, list):
        return None
    out = []
    for t in turns:
        if not isinstance(t, dict):
            return None
        role = t.get("from") if fmt == "sharegpt" else t.get("role")
        content = t.get("value") if fmt == "sharegpt" else t.get("content")
        if role not in ROLE or not isinstance(content, str):
            return None
        out.append({"role": ROLE[role], "content": content})
    return out


def _chat_tokens(tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    if "{% generation %}" in (tok.chat_template or "") or "{%- generation %}" in (tok.chat_template or ""):
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return list(out["input_ids"]), list(out["assistant_masks"])
    # templates without generation markers: an assistant turn is what rendering it adds to the prefix
    ids = list(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    mask = [0] * len(ids)
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(tok.apply_chat_template(messages[:k], tokenize=True, add_generation_prompt=True,
                                            return_dict=True)["input_ids"]) if k else 0
        end = len(tok.apply_chat_template(messages[: k + 1], tokenize=True, return_dict=True)["input_ids"])
        for i in range(start, min(end, len(ids))):
            mask[i] = 1
    return ids, mask


def tokenize_rows(
    rows: Iterable[tuple[str, dict[str, Any]]],
    tok: Any,
    tokenizer_fingerprint: str,
    fmt: str = "auto",
    max_length: int = 2048,
    too_long: str = "truncate",
    limit: int | None = None,
) -> tuple[list[SampleTokens], InputReport]:
    """Samples (deduplicated by key, input order kept) and a report of what was rejected and why."""
    report = InputReport()
    samples: list[SampleTokens] = []
    seen: set[str] = set()
    checked_template = False
    for _, row in rows:
        if limit is not None and report.usable >= limit:
            break
        report.rows += 1
        f = detect_format(row) if fmt == "auto" else fmt
        if f is None:
            report.rejected["unknown format (no conversations/messages/text/prompt+completion)"] += 1
            continue
        if f in ("sharegpt", "openai"):
            if not checked_template:
                if not getattr(tok, "chat_template", None):
                    raise BadInput("the tokenizer has no chat template, but the data is chat (conversations/messages); "
                                   "add chat_template.jinja to the model folder or use text/prompt_completion data")
                checked_template = True
            msgs = to_messages(row, f)
            if msgs is None:
                report.rejected["malformed chat"] += 1
                continue
            if not msgs or all(not m["content"].strip() for m in msgs):
                report.rejected["empty"] += 1
                continue
            if not any(m["role"] == "assistant" for m in msgs):
                report.rejected["no assistant turn"] += 1
                continue
            try:
                ids, mask = _chat_tokens(tok, msgs)
            except Exception as e:
                report.rejected[f"chat template failed ({type(e).__name__})"] += 1
                continue
        elif f == "text":
            text = row.get("text")
            if not isinstance(text, str):
                report.rejected["malformed text"] += 1
                continue
            if not text.strip():
                report.rejected["empty"] += 1
                continue
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            mask = [1] * len(ids)
        elif f == "prompt_completion":
            p, c = row.get("prompt"), row.get("completion")
            if not isinstance(p, str) or not isinstance(c, str):
                report.rejected["malformed prompt/completion"] += 1
                continue
            if not c.strip():
                report.rejected["empty"] += 1
                continue
            pi = list(tok(p, add_special_tokens=False)["input_ids"])
            ci = list(tok(c, add_special_tokens=False)["input_ids"])
            ids, mask = pi + ci, [0] * len(pi) + [1] * len(ci)
        else:
            raise BadInput(f"unknown data format {f!r}")
        if len(ids) > max_length:
            if too_long == "skip":
                report.rejected[f"longer than max_length={max_length}"] += 1
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            report.truncated += 1
        if not any(mask):
            report.rejected["no trainable tokens (loss mask empty)"] += 1
            continue
        a = np.asarray(ids, dtype=np.int32)
        m = np.asarray(mask, dtype=np.uint8)
        key = sample_key(tokenizer_fingerprint, a, m)
        if key in seen:
            report.duplicates += 1
            continue
        seen.add(key)
        samples.append(SampleTokens(key, a, m))
        report.usable += 1
    if not samples:
        reasons = ", ".join(f"{k}: {v}" for k, v in report.rejected.items()) or "no rows"
        raise BadInput(f"no usable rows in the data files ({report.rows} rows read; {reasons}); check [data] files and format")
    return samples, report

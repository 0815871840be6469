"""Chat tokenization speed: hsstore's marked-rendering loss mask against the two methods it replaced, same run.

Baselines (1b276ea): transformers' ``{% generation %}`` mask (``return_assistant_tokens_mask``), and the
prefix-diff method (render each assistant turn's prefix; wrong under templates like Qwen3's). All three on
the builtin ChatML tokenizer, over multi-turn conversations built from the bundled data.

    python scripts/bench_inputs.py --rows 2000 --turns 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hsstore.capture.inputs.lossmask import ChatMasker
from hsstore.capture.inputs.messages import ROLES
from hsstore.capture.model.builtin import builtin_tokenizer

DATA = Path(__file__).resolve().parents[1] / "hsstore" / "data" / "conversations.jsonl"


def conversations(rows: int, turns: int) -> list[list[dict[str, str]]]:
    pairs = []
    for line in DATA.read_text().splitlines():
        r = json.loads(line)
        msgs = r.get("messages") or [{"role": ROLES[t["from"]], "content": t["value"]} for t in r["conversations"]]
        pairs.append([m for m in msgs if m["role"] != "system"][:2])
    out = []
    for i in range(rows):
        conv = [m for k in range(turns) for m in pairs[(i * 7 + k) % len(pairs)]]
        conv[-1] = {**conv[-1], "content": conv[-1]["content"] + f" ({i})"}
        out.append(conv)
    return out


def generation_markers(tok: Any, msgs: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def prefix_diff(tok: Any, msgs: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    ids = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])
    mask = [0] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] == "assistant":
            start = (
                len(
                    tok.apply_chat_template(msgs[:k], tokenize=True, add_generation_prompt=True, return_dict=True)[
                        "input_ids"
                    ]
                )
                if k
                else 0
            )
            end = len(tok.apply_chat_template(msgs[: k + 1], tokenize=True, return_dict=True)["input_ids"])
            mask[start:end] = [1] * (min(end, len(ids)) - start)
    return ids, mask


def rate(fn: Any, convs: list[list[dict[str, str]]]) -> float:
    t = time.perf_counter()
    for c in convs:
        fn(c)
    return len(convs) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=3, help="user/assistant pairs per conversation")
    args = ap.parse_args()
    tok = builtin_tokenizer()
    masker = ChatMasker(tok)
    convs = conversations(args.rows, args.turns)
    rate(masker, convs[:50])  # warm the template cache
    results = {
        "rows": args.rows,
        "turns": args.turns,
        "hsstore rows/s": rate(masker, convs),
        "generation markers rows/s": rate(lambda c: generation_markers(tok, c), convs),
        "prefix diff rows/s": rate(lambda c: prefix_diff(tok, c), convs),
    }
    same = sum(masker(c) == generation_markers(tok, c) for c in convs[:200])
    results["masks equal to the generation markers' (of 200)"] = same
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

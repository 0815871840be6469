"""End to end: `hsstore build` from real save_pretrained folders (hybrid qwen3_5_text and dense llama) whose
tokenizer carries a real chat template, then every stored loss mask checked by decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from chat_fixtures import FIXTURES, GOLDEN, TWO_TURNS, load, make_tokenizer, reference_ids, rich_conversation, spans
from helpers import run_cli, write_manifest

from hsstore import HiddenStateDataset
from hsstore.capture.model.builtin import builtin_config

# each template once, half on the hybrid Gated-DeltaNet model, half on the dense one (both kinds per family
# would double the builds for no new path: the mask is computed before any model runs)
CASES = [(name, "tiny-qwen3_5" if i % 2 == 0 else "tiny-llama") for i, name in enumerate(FIXTURES)]
TWO_TURN_REPLIES = {
    "qwen3": ["It is four.<|im_end|>", "<think>\n\n</think>\n\nIt is six.<|im_end|>"],
    # the prompt ends in "<think>\n" and the empty think block adds "\n": the trained vocabulary merges the two
    # newlines into one token that is half prompt, so it is not trained on (docs/inputs.md)
    "qwen2_5": ["It is four.<|im_end|>", "It is six.<|im_end|>"],
    "qwen3_5": ["It is four.<|im_end|>", "</think>\n\nIt is six.<|im_end|>"],
    "llama3": ["It is four.<|eot_id|>", "It is six.<|eot_id|>"],
    "mistral_nemo": ["It is four.</s>", "It is six.</s>"],
    "gemma2": ["It is four.<end_of_turn>", "It is six.<end_of_turn>"],
    "deepseek_r1": ["It is four.<｜end▁of▁sentence｜>", "It is six.<｜end▁of▁sentence｜>"],
    "gpt_oss": ["<|channel|>final<|message|>It is four.<|end|>", "<|channel|>final<|message|>It is six.<|return|>"],
    "granite3_3": ["It is four.<|end_of_text|>", "It is six.<|end_of_text|>"],
    "mistral_small3_2": ["It is four.</s>", "It is six.</s>"],
}


def _saved_model(d: Path, name: str, builtin: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = make_tokenizer(name)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(builtin_config(builtin, vocab_size=len(tok))).save_pretrained(d)
    tok.save_pretrained(d)
    return AutoTokenizer.from_pretrained(d)  # what the build loads: template and special tokens round-tripped


@pytest.mark.parametrize("name, builtin", CASES)
def test_build_from_saved_model_stores_masks_of_exactly_the_replies(tmp_path: Path, name: str, builtin: str):
    tok = _saved_model(tmp_path / "model", name, builtin)
    rich = rich_conversation(load(name)["supports"])
    user_mistake = [{"role": "user", "content": f"stop {tok.eos_token} here"}, TWO_TURNS[1]]
    rows = [{"messages": rich}, {"messages": TWO_TURNS}, {"messages": user_mistake}, {"messages": TWO_TURNS}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    manifest = write_manifest(
        tmp_path / "m.toml",
        model=str(tmp_path / "model"),
        files=[str(tmp_path / "rows.jsonl")],
        store=str(tmp_path / "s.zarr"),
        layers="{ aux = [0, 1], target = [3] }",
        dtypes='["fp32"]',
        max_length=2048,
    )  # Mistral-Small-3.2's default system prompt is 1,673 tokens here
    out = run_cli("build", str(manifest), "--quiet", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    inputs = json.loads(out.stdout)["inputs"]
    assert (inputs["usable"], inputs["duplicates"]) == (2, 1) and inputs["loss_mask"] == "reply+eot/v1"
    assert list(inputs["rejected"]) == [
        "a message contains a special token's text (it would tokenize as a control token)"
    ]
    ds = HiddenStateDataset(tmp_path / "s.zarr")
    got = {}
    for i in range(len(ds)):
        item = ds[i]
        ids = item["input_ids"].tolist()
        assert ids in (reference_ids(tok, c) for c in (rich, TWO_TURNS))
        got["rich" if "Weather in Paris?" in tok.decode(ids) else "two"] = spans(tok, ids, item["loss_mask"].tolist())
        assert item["target_hidden"].shape[0] == len(ids)
    assert got == {"rich": GOLDEN[name], "two": TWO_TURN_REPLIES[name]}
    # a template that prints today's date was rendered with the pinned day, and the recipe says so
    day = "2024-07-26" if "strftime_now" in load(name)["chat_template"] else None
    assert ds.provenance["recipe"]["tokenizer"].get("chat_date") == day

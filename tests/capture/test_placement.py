"""One model over several devices (gpus_per_rank > 1): the stage plan, the device map, and that a
spread model computes the same states. On CPU the "devices" are all the CPU, so these tests check
accelerate's hooks and the loading paths; the cross-GPU copies run on the 2-GPU machine
(tests/scenarios/test_gpu.py, docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils import check_device_map
from helpers import REPO

from hsstore.capture.model.builtin import builtin_config, builtin_tokenizer
from hsstore.capture.model.placement import contiguous_split, device_map, stages
from hsstore.capture.model.spec import ModelSpec
from hsstore.capture.run.hooks import LayerCapture, decoder_layers


@pytest.mark.parametrize(
    "sizes,parts",
    [
        ([5, 1, 1, 1, 1, 1, 1, 1, 1, 5], 2),
        ([3] * 64, 4),
        ([1] * 7, 3),
        ([100, 1, 1], 3),
        ([1, 2, 3, 4, 5, 6, 7, 8], 3),
        ([1, 1], 2),
        ([100, 1, 1, 1], 4),
        ([1, 1, 1, 100], 4),
        ([100, 1, 1, 1, 1, 1], 4),
        ([0, 0, 0], 3),
        ([7], 1),
    ],
)
def test_contiguous_split_is_contiguous_complete_and_balanced(sizes: list[int], parts: int):
    stage = contiguous_split(sizes, parts)
    assert len(stage) == len(sizes)
    assert stage == sorted(stage), "stages must be contiguous runs in layer order"
    assert set(stage) == set(range(parts)), "no stage may be empty"
    loads = [sum(s for s, g in zip(sizes, stage) if g == p) for p in range(parts)]
    ideal = sum(sizes) / parts
    if all(stage.count(p) > 1 for p in range(parts)):  # only forced singletons may exceed the bound
        assert max(loads) <= ideal + max(sizes), (loads, ideal)


def test_contiguous_split_refuses_more_stages_than_layers():
    with pytest.raises(ValueError, match="cannot split 2 items into 3"):
        contiguous_split([1, 1], 3)


@pytest.mark.parametrize("name,tie", [("tiny-qwen3_5", False), ("tiny-llama", False), ("tiny-llama", True)])
@pytest.mark.parametrize("parts", [2, 3])
def test_device_map_places_every_tensor_in_layer_stages(name: str, tie: bool, parts: int):
    from transformers import AutoModelForCausalLM

    config = builtin_config(name, {"tie_word_embeddings": tie}, len(builtin_tokenizer()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n = config.num_hidden_layers
    devices = [f"cuda:{i}" for i in range(parts)]
    dmap = device_map(model, n, devices)
    check_device_map(model, dmap)  # accelerate: every parameter is placed
    st = stages([dmap[f"model.layers.{i}"] for i in range(n)])
    assert [s["device"] for s in st] == devices, "one contiguous stage per device, in order"
    assert st[0]["layers"][0] == 0 and st[-1]["layers"][1] == n - 1
    assert dmap["model.embed_tokens"] == devices[0]
    assert dmap["model.rotary_emb"] == devices[0], "rotary tables are used before layer 0"
    assert dmap["model.norm"] == devices[-1]
    assert dmap["lm_head"] == (devices[0] if tie else devices[-1])


@pytest.mark.parametrize("name", ["tiny-qwen3_5", "tiny-llama"])
def test_spread_builtin_model_captures_the_same_states(name: str):
    spec = ModelSpec(f"builtin:{name}")
    whole = spec.load(torch.float32, "cpu", None)
    spread = spec.load(torch.float32, ["cpu", "cpu"], None)
    layers = decoder_layers(spread, 4)
    assert len(layers) == 4 and all(hasattr(layer, "_hf_hook") for layer in layers), (
        "accelerate's hooks must be in the path"
    )
    ids = torch.randint(3, 250, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    a = LayerCapture(whole, 4, [0, 1, 3]).run(ids, mask)
    b = LayerCapture(spread, 4, [0, 1, 3]).run(ids, mask)
    assert sorted(a) == sorted(b) == [0, 1, 3]
    for i in a:
        assert torch.equal(a[i], b[i]), f"layer {i} differs once the model is spread"


def test_spread_local_model_loads_with_a_device_map_and_matches(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    tok = builtin_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(builtin_config("tiny-llama", vocab_size=len(tok))).save_pretrained(tmp_path / "m")
    spec = ModelSpec(str(tmp_path / "m"))
    whole = spec.load(torch.float32, "cpu", None)
    spread = spec.load(torch.float32, ["cpu", "cpu"], None)
    ids = torch.randint(3, 250, (1, 30), generator=torch.Generator().manual_seed(2))
    a = LayerCapture(whole, 4, [1, 3]).run(ids, torch.ones_like(ids))
    b = LayerCapture(spread, 4, [1, 3]).run(ids, torch.ones_like(ids))
    assert sorted(a) == sorted(b) == [1, 3] and all(torch.equal(a[i], b[i]) for i in a)


@pytest.mark.process
def test_missing_accelerate_is_a_clear_error():
    code = (
        "import sys; sys.modules['accelerate'] = None\n"
        "from hsstore.capture.model.placement import require_accelerate\n"
        "try:\n    require_accelerate()\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.startswith("BadInput") and "pip install 'hsstore[multi-gpu]'" in out, out

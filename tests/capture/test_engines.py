"""The in-process engine's generate context (hsstore.capture.generate.engines)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from hsstore.capture.generate import engines
from hsstore.capture.generate.engines import LocalEngine, generate_attention
from hsstore.core.schema.manifest import GenerateTable


def test_on_a_gpu_generate_runs_without_cudnn_attention() -> None:
    """cuDNN's SDPA builds a plan per shape and every decode step is a new shape: it is left out on a GPU,
    the other kernels stay, and the setting is restored afterwards."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with generate_attention(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_on_the_cpu_generate_attention_changes_nothing() -> None:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with generate_attention(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


class _Model(torch.nn.Module):
    """A stand-in for a causal LM: one parameter (on the CPU); generate appends one token per row."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[dict[str, Any]] = []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append({"shape": tuple(input_ids.shape), "cudnn": torch.backends.cuda.cudnn_sdp_enabled()})
        return torch.cat([input_ids, torch.full((input_ids.shape[0], 1), 7)], dim=1)


def test_each_batch_generates_once_inside_the_generate_attention_context(monkeypatch: Any) -> None:
    """LocalEngine.batch makes one generate call per batch, inside generate_attention of the model's device."""
    entered: list[str] = []
    real = engines.generate_attention

    def spy(device: Any) -> Any:
        entered.append(str(device))
        return real(torch.device("cuda"))  # what a GPU gets, whatever the test machine has

    monkeypatch.setattr(engines, "generate_attention", spy)
    model = _Model()
    tok = SimpleNamespace(eos_token_id=7, pad_token_id=0, get_vocab=lambda: {}, convert_tokens_to_ids=lambda t: None)
    engine = LocalEngine(model, tok, 0, token_budget=1 << 20)
    got: list[tuple[list[int], list[Any]]] = []
    engine.run([[1, 2, 3], [4, 5]], [0, 0], GenerateTable(max_new_tokens=4), lambda b, out: got.append((b, out)))
    assert entered == ["cpu"]
    assert model.calls == [{"shape": (2, 3), "cudnn": False}]
    assert [o.ids for o in got[0][1]] == [[7], [7]] and all(o.finish_reason == "stop" for o in got[0][1])

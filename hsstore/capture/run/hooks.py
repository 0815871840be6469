"""Capture decoder-layer outputs with forward hooks, stopping the forward after the deepest one needed.

Layer i is the raw output of decoder layer i (the residual stream before the final norm), equal to
transformers' ``hidden_states[i + 1]`` for every layer but the last (whose ``hidden_states`` entry is
post-norm). Id ``num_layers`` names the final norm's output (that post-norm entry), captured by a hook
on the norm; id ``EMBEDDINGS`` (-1) the state entering layer 0 (the embeddings as the first layer receives
them: vLLM's input id 0), captured before layer 0 runs. Only requested layers are kept; nothing runs past the deepest one (no lm_head, no logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hsstore.capture.model.placement import decoder_layers, final_norm

EMBEDDINGS = -1


class _StopForward(Exception):
    pass


class LayerCapture:
    """Runs padded batches and returns ``{layer: [B, T, H]}`` for the requested decoder layers."""

    def __init__(self, model: nn.Module, num_layers: int, layers: Sequence[int]) -> None:
        self.model = model
        self.layers = sorted(set(layers))
        self.deepest = self.layers[-1]
        self._out: dict[int, torch.Tensor] = {}
        mods = decoder_layers(model, num_layers)
        if self.deepest > num_layers:
            raise ValueError(
                f"layer {self.deepest} does not exist (decoder layers 0..{num_layers - 1}, final norm {num_layers})"
            )
        self._handles = [
            (mods[i] if i < num_layers else final_norm(model, num_layers)).register_forward_hook(self._hook(i))
            for i in self.layers
            if i != EMBEDDINGS
        ]
        if EMBEDDINGS in self.layers:
            self._handles.append(mods[0].register_forward_pre_hook(self._entering, with_kwargs=True))

    def _entering(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor):  # a layer called otherwise leaves the point out (not captured)
            self._out[EMBEDDINGS] = x
        if self.deepest == EMBEDDINGS:
            raise _StopForward

    def _hook(self, index: int) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            self._out[index] = output[0] if isinstance(output, (tuple, list)) else output
            if index == self.deepest:
                raise _StopForward

        return hook

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[int, torch.Tensor]:
        self._out = {}
        try:
            self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        except _StopForward:
            pass
        missing = [i for i in self.layers if i not in self._out and i != EMBEDDINGS]
        if missing:
            raise RuntimeError(f"decoder layer(s) {missing} did not run; the model skipped them")
        out, self._out = self._out, {}
        return out

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def pad_batch(
    seqs: Sequence[torch.Tensor], pad_id: int, device: str, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [B, T]`` and ``attention_mask [B, T]`` (1 = real token); ``T`` is the
    longest sequence, or ``width`` if given (at least the longest: batching.padded_length)."""
    width = max([int(s.shape[0]) for s in seqs] + [int(width or 0)])
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : s.shape[0]] = s
        mask[b, : s.shape[0]] = 1
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)

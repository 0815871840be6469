"""``hsstore plan --calibrate N``: the first N batches of the build's own plan run through the real model,
per dtype, to measure what a plan otherwise assumes: how well each codec compresses these states (per
layer, in every storage form, FP8 scales included) and the forward's tokens/s.

States are encoded exactly as the writer encodes them (hsstore.storage.shardio.encode_shard, the same
chunking); nothing is written. The first batch of several is a warm-up (kernel compilation, allocator
growth) and is left out of the timing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hsstore.storage.codecs import SCALE_CHUNK_ROWS, chunk_tokens
from hsstore.storage.sizing import FORMS, Ratios, StoredForm


@dataclass(frozen=True)
class Calibration:
    """What N batches of one dtype measured: forward tokens and seconds (warm-up excluded), the padded
    batch shapes those seconds ran, and the codec ratios of each storage form."""

    dtype: str
    batches: int
    tokens: int
    seconds: float
    shapes: list[tuple[int, int]]  # (rows, padded width) of the timed batches
    ratios: dict[str, Ratios]  # form -> ratios with the manifest's codec (FP8: its codes' codec)
    device_name: str


def _payload_ratio(data: np.ndarray, chunk: int, codec: str, unit: int) -> float:
    """Raw bytes of ``data`` / the bytes its chunks encode to with ``codec``, cut into units of ``unit``
    rows and chunked as the writer chunks them (a chunk never spans two units)."""
    from hsstore.storage.shardio import encode_shard

    payload = 0
    for start in range(0, data.shape[0], unit):
        piece = data[start:start + unit]
        parts = encode_shard(piece, min(chunk, max(1, piece.shape[0])), codec)
        payload += sum(len(memoryview(p).cast("B")) for p in parts[0:-2:2])
    return data.nbytes / max(1, payload)


def form_ratios(states: dict[int, Any], codec: str, unit_tokens: Any) -> dict[str, Ratios]:
    """Per storage form, the ratio of each layer's ``states`` (``layer -> [T, H]`` tensor) with ``codec``;
    ``unit_tokens(itemsize)``: the tokens of the build's units in a form of that value size."""
    from hsstore.core.dtypes import TORCH, to_stored
    from hsstore.core.quant import quantize

    out = {}
    for name in FORMS:
        form = StoredForm.of(name if name in TORCH else "bf16", name if name not in TORCH else None, codec)
        layers, scales = {}, []
        for i, t in states.items():
            hidden = int(t.shape[1])
            if form.quantized:
                q = quantize(t)
                data = q.codes.cpu().numpy()
                scales.append(_payload_ratio(q.scales.cpu().numpy(), SCALE_CHUNK_ROWS, form.codec, unit_tokens(1)))
            else:
                data = to_stored(t.to(TORCH[name]).cpu())
            layers[i] = _payload_ratio(data, chunk_tokens(hidden, form.itemsize), form.codec, unit_tokens(form.itemsize))
        mean = sum(layers.values()) / len(layers)
        out[name] = Ratios(mean, layers, min(scales) if scales else 1.0)
    return out


def _states(cap: Any, samples: list, batch: list[int], pad_id: int, device: str) -> tuple[dict[int, Any], int]:
    """One batch through ``cap``: each captured layer's states of the batch's real tokens ``[T, H]``."""
    import torch

    from hsstore.build.capture import pad_batch
    from hsstore.core.batching import padded_length

    seqs = [torch.from_numpy(samples[i].input_ids.astype("int64")) for i in batch]
    width = padded_length(max(int(s.shape[0]) for s in seqs))
    out = cap.run(*pad_batch(seqs, pad_id, device, width))
    lengths = [samples[i].length for i in batch]
    return {k: torch.cat([v[r, :n] for r, n in enumerate(lengths)]) for k, v in out.items()}, width


def calibrate(inp: Any, batches: list[list[int]], n: int, dtype: str, device: str, attn: str, codec: str,
              unit_tokens: int | None) -> Calibration:
    """Run the first ``n`` of ``batches`` (indices into ``inp.samples``) in ``dtype`` on ``device``;
    ``unit_tokens``: the manifest's (None: the build's default for each form)."""
    import torch

    from hsstore.build.capture import LayerCapture
    from hsstore.build.environment import device_info
    from hsstore.core.dtypes import TORCH
    from hsstore.core.unitplan import default_unit_tokens

    model = inp.spec.load(TORCH[dtype], [device], attn)
    layers = inp.recipe.layers.all
    cap = LayerCapture(model, int(inp.recipe.model.num_layers), layers)
    run = batches[:n]
    kept: dict[int, list] = {i: [] for i in layers}
    tokens, seconds, shapes = 0, 0.0, []
    try:
        for k, batch in enumerate(run):
            t0 = time.perf_counter()
            states, width = _states(cap, inp.samples, batch, inp.pad_id, device)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            if k > 0 or len(run) == 1:  # the first of several is the warm-up
                seconds += time.perf_counter() - t0
                tokens += sum(inp.samples[i].length for i in batch)
                shapes.append((len(batch), width))
            for i, t in states.items():
                kept[i].append(t)
    finally:
        cap.close()
    hidden = int(inp.recipe.model.hidden_size)
    ratios = form_ratios({i: torch.cat(v) for i, v in kept.items()}, codec,
                         lambda itemsize: unit_tokens or default_unit_tokens(hidden, itemsize, len(layers)))
    del model
    return Calibration(dtype, len(run), tokens, seconds, shapes, ratios, str(device_info(device)["device_name"]))

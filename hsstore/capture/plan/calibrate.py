"""``hsstore plan --calibrate N``: N batches of the build's own plan run through the real model, per dtype,
to measure what a plan otherwise assumes: how well each codec compresses these states (per layer, in
every storage form, FP8 scales included) and the forward's tokens/s.

The N batches are spread evenly over the plan (the plan runs longest samples first, and how well states
compress depends on the samples: the first batch alone misjudged the tiny model's ratio by 20 %).

States are encoded exactly as the writer encodes them (hsstore.storage.shardio.encode_shard, the same
chunking); nothing is written. Every one of the N batches is timed: a warm-up forward of the shortest
of them runs first, untimed (kernel compilation, allocator growth). The time of encoding each storage
form is measured too (the build compresses what it writes: fp32 states take twice the bytes to encode),
so the plan's time is forward plus encoding, per dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hsstore.core.batching import default_unit_tokens
from hsstore.storage.codecs import SCALE_CHUNK_ROWS, chunk_tokens
from hsstore.storage.sizing import FORMS, Ratios, StoredForm

if TYPE_CHECKING:
    from hsstore.core.keys import SampleTokens


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
    encode_seconds: dict[str, float] = field(default_factory=dict)  # form -> seconds to encode the batches' states


def _payload_ratio(pieces: list[np.ndarray], chunk: int, codec: str) -> float:
    """Raw bytes of ``pieces`` (one per unit) / the bytes their chunks encode to with ``codec``, chunked as
    the writer chunks a unit (a chunk never spans two units)."""
    from hsstore.storage.shardio import encode_shard

    payload = raw = 0
    for piece in pieces:
        parts = encode_shard(piece, min(chunk, max(1, piece.shape[0])), codec)
        payload += sum(len(memoryview(p).cast("B")) for p in parts[0:-2:2])
        raw += piece.nbytes
    return raw / max(1, payload)


def _by_unit(batches: list[dict[int, Any]], units: list[int], layer: int, convert: Any) -> list[np.ndarray]:
    """Layer ``layer`` of the calibration ``batches`` joined per unit (``units``: each batch's unit)."""
    import torch

    return [convert(torch.cat([b[layer] for b, u in zip(batches, units) if u == unit])) for unit in sorted(set(units))]


def form_ratios(
    batches: list[dict[int, Any]], codec: str, units: Any, seconds: dict[str, float] | None = None
) -> dict[str, Ratios]:
    """Per storage form, each layer's ratio with ``codec`` over the states of ``batches`` (per batch: layer
    -> ``[T, H]``), grouped in units as the build groups them: ``units(itemsize)``, each batch's unit;
    ``seconds`` (if given) gets each form's encoding time."""
    from hsstore.core.dtypes import TORCH, to_stored
    from hsstore.core.quant import quantize

    out = {}
    for name in FORMS:
        t0 = time.perf_counter()
        form = StoredForm.of(name if name in TORCH else "bf16", name if name not in TORCH else None, codec)
        where = units(form.itemsize)
        layers, scales = {}, []
        for i in batches[0]:
            hidden = int(batches[0][i].shape[1])
            if form.quantized:
                scales.append(
                    _payload_ratio(
                        _by_unit(batches, where, i, lambda t: quantize(t).scales.cpu().numpy()),
                        SCALE_CHUNK_ROWS,
                        form.codec,
                    )
                )
                pieces = _by_unit(batches, where, i, lambda t: quantize(t).codes.cpu().numpy())
            else:
                pieces = _by_unit(batches, where, i, lambda t: to_stored(t.to(TORCH[name]).cpu()))
            layers[i] = _payload_ratio(pieces, chunk_tokens(hidden, form.itemsize), form.codec)
        out[name] = Ratios(sum(layers.values()) / len(layers), layers, min(scales) if scales else 1.0)
        if seconds is not None:
            seconds[name] = time.perf_counter() - t0
    return out


def _states(
    cap: Any, samples: list[SampleTokens], batch: list[int], pad_id: int, device: str
) -> tuple[dict[int, Any], int]:
    """One batch through ``cap``: each captured layer's states of the batch's real tokens ``[T, H]``."""
    import torch

    from hsstore.capture.run.hooks import pad_batch
    from hsstore.core.batching import padded_length

    seqs = [torch.from_numpy(samples[i].input_ids.astype("int64")) for i in batch]
    width = padded_length(max(int(s.shape[0]) for s in seqs))
    out = cap.run(*pad_batch(seqs, pad_id, device, width))
    lengths = [samples[i].length for i in batch]
    return {k: torch.cat([v[r, :n] for r, n in enumerate(lengths)]) for k, v in out.items()}, width


def spread(count: int, n: int) -> list[int]:
    """``n`` indices of ``range(count)`` spread evenly (the middle one for n = 1); all of them if n >= count."""
    if n >= count:
        return list(range(count))
    return sorted({int((k + 0.5) * count / n) for k in range(n)})


def calibrate(
    inp: Any, batches: list[list[int]], n: int, dtype: str, device: str, attn: str, codec: str, unit_tokens: int | None
) -> Calibration:
    """Run ``n`` of ``batches`` (indices into ``inp.samples``; ``spread`` over them) in ``dtype`` on
    ``device``; ``unit_tokens``: the manifest's (None: the build's default for each form)."""
    from hsstore.core.batching import batch_units

    picked = spread(len(batches), n)
    hidden, layers = int(inp.recipe.model.hidden_size), inp.recipe.layers.all
    per_batch = [sum(inp.samples[i].length for i in b) for b in batches]

    def units(itemsize: int) -> list[int]:
        every = batch_units(per_batch, unit_tokens or default_unit_tokens(hidden, itemsize, len(layers)))
        return [every[k] for k in picked]

    states, (tokens, seconds, shapes, name) = _forwards(inp, [batches[k] for k in picked], dtype, device, attn)
    encode: dict[str, float] = {}
    ratios = form_ratios(states, codec, units, encode)
    return Calibration(
        dtype=dtype,
        batches=len(picked),
        tokens=tokens,
        seconds=seconds,
        shapes=shapes,
        ratios=ratios,
        device_name=name,
        encode_seconds=encode,
    )


def _forwards(
    inp: Any, run: list[list[int]], dtype: str, device: str, attn: str
) -> tuple[list[dict[int, Any]], tuple[int, float, list[tuple[int, int]], str]]:
    """The captured states of each batch of ``run`` and (tokens, seconds, shapes, device name) of them all,
    timed after an untimed warm-up forward of the first sample of the shortest batch."""
    import torch

    from hsstore.capture.model.environment import device_info
    from hsstore.capture.run.hooks import LayerCapture
    from hsstore.core.dtypes import TORCH

    model = inp.spec.load(TORCH[dtype], [device], attn)
    cap = LayerCapture(model, int(inp.recipe.model.num_layers), inp.recipe.layers.all)
    kept: list[dict[int, Any]] = []
    tokens, seconds = 0, 0.0
    shapes: list[tuple[int, int]] = []
    try:
        shortest = min(run, key=lambda b: sum(inp.samples[i].length for i in b))
        _states(cap, inp.samples, shortest[:1], inp.pad_id, device)  # the warm-up: not timed, not kept
        for batch in run:
            t0 = time.perf_counter()
            states, width = _states(cap, inp.samples, batch, inp.pad_id, device)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - t0
            tokens += sum(inp.samples[i].length for i in batch)
            shapes.append((len(batch), width))
            kept.append(states)
    finally:
        cap.close()
    return kept, (tokens, seconds, shapes, str(device_info(device)["device_name"]))

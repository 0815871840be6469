"""Reading a variant stored quantized (FP8 e4m3 codes + per-token scales): a sample's layers stacked per
group, dequantized to bf16 as they are read (exact; hsstore.core.quant) or handed out raw."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hsstore.core.errors import CorruptData
from hsstore.core.fp8_cpu import dequantize_bf16_bits
from hsstore.core.quant import FP8
from hsstore.storage import layout, outbuf
from hsstore.storage.chunkcache import scratch


def read_quantized(reader: Any, ref: Any, layers: list[int], raw: bool = False) -> Any:
    """``[T, n, H]`` bf16 states of ``layers`` of sample ``ref``; with ``raw``, the e4m3 codes as a
    ``float8_e4m3fn`` tensor ``[T, n, H]`` and their scales ``[T, n, 1]`` float32 (value = code * scale)."""
    return quantized_groups(reader, ref, [layers], raw)[0]


def quantized_groups(reader: Any, ref: Any, groups: list[list[int]], raw: bool = False) -> list[Any]:
    """``read_quantized`` of each group of layers, every layer of the sample read in one pass
    (``reader.run_tasks``: side by side on threads for large samples)."""
    T, H = ref.length, reader.record.hidden_size
    tasks, outs, nbytes = [], [], 0
    for layers in groups:
        n = len(layers)
        scales, scales_t = outbuf.empty((T, n, 1), np.float32)
        data, data_t = outbuf.empty((T, n, H), np.uint8 if raw else np.uint16)
        for j, layer in enumerate(layers):
            tasks += [(_one_piece, reader, ref, layer, a, b, scales[a:b, j], data[a:b, j], raw)
                      for a, b in reader.pieces(ref, layout.layer_array(layer), 2 * H)]
        outs.append((data_t, scales_t))
        nbytes += T * n * H * 2  # the bf16 it becomes (or the codes' reads when raw)
    try:
        reader.run_tasks(tasks, nbytes)
    except CorruptData as e:
        raise CorruptData(str(e) if ref.key in str(e) else f"sample {ref.key}: {e}") from None
    if raw:
        return [(d.view(FP8), s) for d, s in outs]
    return [d.view(torch.bfloat16) for d, _ in outs]


def _one_piece(reader: Any, ref: Any, layer: int, a: int, b: int, scales: np.ndarray, dest: np.ndarray,
               raw: bool) -> None:
    """Rows ``[a, b)`` of one layer: scales into ``scales``, codes (``raw``) or their bf16 bits into ``dest``."""
    reader.read_array(ref, layout.scale_array(layer), scales, a, b)
    if raw:
        reader.read_array(ref, layout.layer_array(layer), dest, a, b)
        return
    # the codes land in this thread's reused buffer (no fresh pages a piece), then become bf16 in ``dest``
    codes = np.frombuffer(scratch("codes").view((b - a) * dest.shape[-1]), np.uint8).reshape(b - a, dest.shape[-1])
    reader.read_array(ref, layout.layer_array(layer), codes, a, b)
    try:
        dequantize_bf16_bits(codes, scales, out=dest)
    except ValueError as e:  # a scale that is not a power of two: not what hsstore wrote
        raise CorruptData(f"unit {ref.unit} of variant {reader.id}, {layout.scale_array(layer)}: {e}") from None

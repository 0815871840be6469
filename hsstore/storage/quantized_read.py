"""Reading a variant stored quantized (FP8 e4m3 codes + per-token scales): one sample's layers stacked,
dequantized to bf16 on the layer threads (exact; hsstore.core.quant) or handed out raw."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hsstore.core.errors import CorruptData
from hsstore.core.fp8_cpu import dequantize_bf16_bits
from hsstore.core.quant import FP8
from hsstore.storage import layout


def read_quantized(reader: Any, ref: Any, layers: list[int], raw: bool = False) -> Any:
    """``[T, n, H]`` bf16 states of ``layers`` of sample ``ref``; with ``raw``, the e4m3 codes as a
    ``float8_e4m3fn`` tensor ``[T, n, H]`` and their scales ``[T, n, 1]`` float32 (value = code * scale)."""
    T, n, H = ref.length, len(layers), reader.record.hidden_size
    scales = np.empty((T, n, 1), np.float32)
    codes = np.empty((T, n, H), np.uint8) if raw else None
    out = None if raw else np.empty((T, n, H), np.uint16)

    def one(j: int) -> None:
        reader.read_array(ref, layout.scale_array(layers[j]), out=scales[:, j])
        if raw:
            reader.read_array(ref, layout.layer_array(layers[j]), out=codes[:, j])
            return
        layer_codes = reader.read_array(ref, layout.layer_array(layers[j]))
        try:
            dequantize_bf16_bits(layer_codes, scales[:, j], out=out[:, j])
        except ValueError as e:  # a scale that is not a power of two: not what hsstore wrote
            raise CorruptData(f"unit {ref.unit} of variant {reader.id}, {layout.scale_array(layers[j])}: {e}") from None

    try:
        pool = reader._layer_pool() if n > 1 else None
        if pool is None:
            for j in range(n):
                one(j)
        else:  # read, decode and dequantize layers side by side (the dequantizing loop releases the GIL)
            for f in [pool.submit(one, j) for j in range(n)]:
                f.result()
    except CorruptData as e:
        raise CorruptData(str(e) if ref.key in str(e) else f"sample {ref.key}: {e}") from None
    if raw:
        return torch.from_numpy(codes).view(FP8), torch.from_numpy(scales)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)

"""The buffers reads decode into: plain memory, or shared memory inside a DataLoader worker process.

A DataLoader worker hands each item to the main process through shared memory: a tensor in ordinary
memory is first copied into a new shared segment, one whose storage already lives there goes as it is.
Decoding straight into shared memory in a worker saves that copy of every sample's states.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# numpy dtypes reads produce -> a torch dtype of the same width (bf16 bits are uint16: int16 holds them)
_TORCH = {np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.int16, np.dtype(np.int16): torch.int16,
          np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32, np.dtype(np.int32): torch.int32}


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> tuple[np.ndarray, torch.Tensor]:
    """An uninitialized buffer as (numpy array of ``dtype``, torch tensor over the same memory), in shared
    memory inside a DataLoader worker (``torch.utils.data.get_worker_info()``), else ordinary memory."""
    dt = np.dtype(dtype)
    if torch.utils.data.get_worker_info() is None or dt not in _TORCH:
        a = np.empty(shape, dt)
        return a, torch.from_numpy(a.view(np.int16) if dt == np.uint16 else a)
    t = torch.empty(0, dtype=_TORCH[dt]).set_(torch.UntypedStorage._new_shared(max(1, math.prod(shape) * dt.itemsize)))
    t = t[: math.prod(shape)].view(shape)
    return t.numpy().view(dt), t


def as_dtype(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor from ``empty`` as the stored dtype ``name`` (bf16 bits viewed as torch.bfloat16)."""
    return tensor.view(torch.bfloat16) if name == "bf16" else tensor

"""The buffers reads decode into: plain memory, or shared memory inside a DataLoader worker process.

A DataLoader worker hands each item to the main process through shared memory: a tensor in ordinary
memory is first copied into a new shared segment, one whose storage already lives there goes as it is.
Decoding straight into shared memory in a worker saves that copy of every sample's states.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import torch

from hsstore.core.errors import CorruptData
from hsstore.core.quant import FP8, dequantize_bf16_bits
from hsstore.storage import layout
from hsstore.storage.shardio import scratch

if TYPE_CHECKING:
    from hsstore.core.schema.store_records import VariantRecord
    from hsstore.storage.sample_table import SampleRef

# a group of layers' states [T, n, H]; raw FP8: (float8_e4m3fn codes [T, n, H], float32 scales [T, n, 1])
Stacked: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"


class Reader(Protocol):
    """What a quantized read needs of hsstore.storage.reader.VariantReader (which imports this module)."""

    id: str
    record: VariantRecord

    def pieces(self, ref: SampleRef, name: str, row_bytes: int) -> list[tuple[int, int]]: ...

    def run_tasks(self, tasks: list[tuple[Any, ...]], nbytes: int) -> None: ...

    def read_array(
        self, ref: SampleRef, name: str, out: np.ndarray | None = None, a: int = 0, b: int | None = None
    ) -> np.ndarray: ...


# numpy dtypes reads produce -> a torch dtype of the same width (bf16 bits are uint16: int16 holds them)
_TORCH = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.uint16): torch.int16,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.int32): torch.int32,
}


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> tuple[np.ndarray, torch.Tensor]:
    """An uninitialized buffer as (numpy array of ``dtype``, torch tensor over the same memory), in shared
    memory inside a DataLoader worker (``torch.utils.data.get_worker_info()``), else ordinary memory."""
    dt = np.dtype(dtype)
    if torch.utils.data.get_worker_info() is None or dt not in _TORCH:
        a = np.empty(shape, dt)
        return a, torch.from_numpy(a.view(np.int16) if dt == np.uint16 else a)
    # torch leaves _new_shared unannotated (shared memory a DataLoader worker hands over without a copy)
    storage = torch.UntypedStorage._new_shared(max(1, math.prod(shape) * dt.itemsize))  # type: ignore[no-untyped-call]
    t = torch.empty(0, dtype=_TORCH[dt]).set_(storage)
    t = t[: math.prod(shape)].view(shape)
    return t.numpy().view(dt), t


def as_dtype(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor from ``empty`` as the stored dtype ``name`` (bf16 bits viewed as torch.bfloat16)."""
    return tensor.view(torch.bfloat16) if name == "bf16" else tensor


# --- Reading a variant stored quantized (FP8 e4m3 codes + per-token scales): a sample's layers stacked per


def quantized_groups(reader: Reader, ref: SampleRef, groups: list[list[int]], raw: bool = False) -> list[Stacked]:
    """Each group's ``[T, n, H]`` bf16 states of sample ``ref``; with ``raw``, the e4m3 codes as a
    ``float8_e4m3fn`` tensor ``[T, n, H]`` and their scales ``[T, n, 1]`` float32 (value = code * scale).
    Every layer of the sample read in one pass
    (``reader.run_tasks``: side by side on threads for large samples)."""
    T, H = ref.length, reader.record.hidden_size
    tasks, outs, nbytes = [], [], 0
    for layers in groups:
        n = len(layers)
        scales, scales_t = empty((T, n, 1), np.float32)
        data, data_t = empty((T, n, H), np.uint8 if raw else np.uint16)
        for j, layer in enumerate(layers):
            tasks += [
                (_one_piece, reader, ref, layer, a, b, scales[a:b, j], data[a:b, j], raw)
                for a, b in reader.pieces(ref, layout.layer_array(layer), 2 * H)
            ]
        outs.append((data_t, scales_t))
        nbytes += T * n * H * 2  # the bf16 it becomes (or the codes' reads when raw)
    try:
        reader.run_tasks(tasks, nbytes)
    except CorruptData as e:
        raise CorruptData(str(e) if ref.key in str(e) else f"sample {ref.key}: {e}") from None
    if raw:
        return [(d.view(FP8), s) for d, s in outs]
    return [d.view(torch.bfloat16) for d, _ in outs]


def _one_piece(
    reader: Reader, ref: SampleRef, layer: int, a: int, b: int, scales: np.ndarray, dest: np.ndarray, raw: bool
) -> None:
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

"""Sample keys: content hashes of (tokenizer fingerprint, token ids, loss mask)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash


def sample_key(tokenizer_fingerprint: str, input_ids: np.ndarray, loss_mask: np.ndarray) -> str:
    """xxh3_128 hex of tokenizer fingerprint ‖ int32-LE token bytes ‖ uint8 loss-mask bytes."""
    ids = np.ascontiguousarray(input_ids, dtype="<i4")
    mask = np.ascontiguousarray(loss_mask, dtype=np.uint8)
    if ids.ndim != 1 or ids.shape != mask.shape:
        raise ValueError(f"input_ids {ids.shape} and loss_mask {mask.shape} must be 1-D and of equal length")
    h = xxhash.xxh3_128()
    h.update(tokenizer_fingerprint.encode("ascii"))
    h.update(ids.tobytes())
    h.update(mask.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class SampleTokens:
    """A tokenized sample: its key, token ids (int32) and loss mask (uint8)."""

    key: str
    input_ids: np.ndarray
    loss_mask: np.ndarray

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

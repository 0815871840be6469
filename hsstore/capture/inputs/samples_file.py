"""Tokenized samples handed from the build driver to its workers: one .npz of plain arrays (no pickle)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hsstore.core.keys import SampleTokens


def save_samples(path: str | Path, samples: Sequence[SampleTokens]) -> None:
    lengths = np.array([s.length for s in samples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    np.savez(
        path,
        keys=np.array([s.key for s in samples], dtype="<U32"),
        offsets=offsets,
        input_ids=np.concatenate([s.input_ids for s in samples]).astype(np.int32) if samples else np.zeros(0, np.int32),
        loss_mask=np.concatenate([s.loss_mask for s in samples]).astype(np.uint8) if samples else np.zeros(0, np.uint8),
    )


def load_samples(path: str | Path) -> list[SampleTokens]:
    with np.load(path, allow_pickle=False) as z:
        keys, off, ids, mask = z["keys"], z["offsets"], z["input_ids"], z["loss_mask"]
    return [SampleTokens(str(k), ids[off[i] : off[i + 1]], mask[off[i] : off[i + 1]]) for i, k in enumerate(keys)]

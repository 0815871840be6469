"""Hidden-state dtypes: names, torch dtypes and how each is stored in zarr (bf16 as uint16 bits).

bf16 is stored as ``uint16`` with the logical dtype in the array attributes, so any zarr reader opens
it, and reading back is a zero-copy ``torch.from_numpy(bits).view(torch.bfloat16)``.

torch is imported on first use (``TORCH`` included): reading metadata and verifying a store need only numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

NAMES = ("bf16", "fp16", "fp32")
STORED: dict[str, np.dtype[Any]] = {
    "bf16": np.dtype("uint16"),
    "fp16": np.dtype("float16"),
    "fp32": np.dtype("float32"),
}
# unit roundoff (half the machine epsilon) of each dtype: the scale of one rounding
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}


def __getattr__(name: str) -> Any:
    if name == "TORCH":  # dtype name -> torch dtype, built when first asked for
        import torch

        globals()["TORCH"] = table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_float32(array: np.ndarray, name: str) -> np.ndarray:
    """Stored values of dtype ``name`` as float32 numbers, with numpy only (bf16 bits widen exactly)."""
    if name == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32, copy=False)


def parse_dtype(name: str) -> str:
    aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
    name = aliases.get(name, name)
    if name not in NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(NAMES)}")
    return name


def name_of(dtype: torch.dtype) -> str:
    from hsstore.core.dtypes import TORCH

    for name, t in TORCH.items():
        if t == dtype:
            return str(name)
    raise ValueError(f"hidden states of dtype {dtype} are not supported; use one of {', '.join(NAMES)}")


def to_stored(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the numpy array zarr stores (a view where possible)."""
    import torch

    t = tensor.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy() if hasattr(torch, "uint16") else t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def from_stored(array: np.ndarray, name: str) -> torch.Tensor:
    """The stored numpy array as a torch tensor of the logical dtype, without a copy."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(array))
    if name == "bf16":
        return t.view(torch.bfloat16)
    return t

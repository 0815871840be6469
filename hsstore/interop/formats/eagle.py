"""EAGLE's ``ge_data`` cache (EAGLE-1/2 training data): one ``torch.save`` dict per sample.

Written by ``eagle/ge_data/ge_data_all_*.py`` as ``{outdir}/{index}/data_{i}.ckpt`` with keys
``input_ids`` [T], ``hidden_state`` [T, H] (transformers' last ``hidden_states`` entry: post-norm) and
``loss_mask`` [T]; read by ``CustomDataset`` in ``eagle/train/main.py``, which loads *every* file under
the folder — so ``hsstore export`` puts its record beside the folder, not in it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from hsstore.interop.formats.interface import FormatWriter, TorchDictFormat, atomic_write, torch_bytes
from hsstore.interop.sample import FileDigest, SourceSample


class EagleWriter(FormatWriter):
    def rel(self, index: int, key: str) -> str:
        return f"0/data_{index}.ckpt"

    def write(
        self,
        index: int,
        key: str,
        ids: torch.Tensor,
        mask: torch.Tensor,
        aux: torch.Tensor | None,
        target: torch.Tensor,
        claims: dict[str, Any],
    ) -> FileDigest:
        record = {"input_ids": ids, "hidden_state": target.contiguous(), "loss_mask": mask}
        return atomic_write(self.root, self.rel(index, key), torch_bytes(record))


class Eagle(TorchDictFormat):
    name = "eagle"
    tool = "EAGLE"
    has_aux = False
    layout = "{index}/data_{i}.ckpt: torch.save dict input_ids, hidden_state, loss_mask (ge_data)"
    loader = "eagle/train/main.py CustomDataset"
    suffixes = (".ckpt",)
    exported = re.compile(r"\d+/data_\d+\.ckpt")
    target_key = "hidden_state"

    def read(self, root: Path, item: str) -> SourceSample:
        obj, digest = self.load(root, item)
        ids, mask, _, target = self.sample_states(obj, item)
        return SourceSample(item, ids, mask, None, target, [digest])

    def writer(self, root: Path, compress: bool = False) -> FormatWriter:
        if compress:
            from hsstore.core.errors import BadInput

            raise BadInput("EAGLE reads plain .ckpt files; --compress is for specforge only")
        return EagleWriter(root)

    def sidecar(self, root: Path) -> Path:
        """Beside the folder, as ``DIR.hsstore-export.json`` (EAGLE's list_files loads every file in it); a
        folder spelled ``.`` or ``x/..`` is named by its absolute path (else the record lands inside it)."""
        if root.name in ("", ".", ".."):
            root = Path(os.path.abspath(root))
        return root.parent / f"{root.name}.hsstore-export.json"

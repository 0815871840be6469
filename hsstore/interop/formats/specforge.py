"""SpecForge's offline EAGLE-3 cache: one ``torch.save`` dict per sample.

Written by SpecForge's ``scripts/prepare_hidden_states.py`` as ``rows_{g}-{g+2000}/data_{i}.ckpt`` (or
``.ckpt.gz`` with ``--compress``), keys ``input_ids`` [T], ``loss_mask`` [T], ``hidden_state`` [1, T, H]
(the target) and ``aux_hidden_state`` [1, T, n*H] (aux layers concatenated in capture order); read by
``specforge.data.preprocessing.OfflineEagle3Dataset`` (every ``.ckpt``/``.ckpt.gz`` under the folder).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import torch

from hsstore.core.errors import BadInput
from hsstore.interop.formats.interface import FormatWriter, TorchDictFormat, atomic_write, torch_bytes
from hsstore.interop.sample import FileDigest, SourceSample

GROUP = 2000  # SpecForge's default --file-group-size: files per rows_* folder


class SpecForgeWriter(FormatWriter):
    def rel(self, index: int, key: str) -> str:
        g = (index // GROUP) * GROUP
        return f"rows_{g}-{g + GROUP}/data_{index}.ckpt" + (".gz" if self.compress else "")

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
        if aux is None or aux.shape[1] == 0:
            raise BadInput("SpecForge's EAGLE-3 files need aux layers; the variant has none (export --aux ...)")
        record = {
            "input_ids": ids,
            "loss_mask": mask,
            "aux_hidden_state": aux.reshape(aux.shape[0], -1).unsqueeze(0).contiguous(),
            "hidden_state": target.unsqueeze(0).contiguous(),
        }
        data = torch_bytes(record)
        if self.compress:
            data = gzip.compress(data, compresslevel=6)  # SpecForge's default compression level
        return atomic_write(self.root, self.rel(index, key), data)


class SpecForge(TorchDictFormat):
    name = "specforge"
    tool = "SpecForge"
    layout = "rows_*/data_{i}.ckpt[.gz]: torch.save dict input_ids, loss_mask, hidden_state, aux_hidden_state"
    loader = "specforge.data.preprocessing.OfflineEagle3Dataset"
    suffixes = (".ckpt", ".ckpt.gz")
    exported = re.compile(r"rows_\d+-\d+/data_\d+\.ckpt(\.gz)?")
    target_key, aux_key = "hidden_state", "aux_hidden_state"

    def read(self, root: Path, item: str) -> SourceSample:
        obj, digest = self.load(root, item)
        if "aux_hidden_state" not in obj and "hidden_states" in obj:
            raise BadInput(
                f"{item}: a DFlash-family feature file (hidden_states); only SpecForge's EAGLE-3 files "
                "(hidden_state + aux_hidden_state) are imported"
            )
        ids, mask, aux, target = self.sample_states(obj, item)
        return SourceSample(item, ids, mask, aux, target, [digest])

    def writer(self, root: Path, compress: bool = False) -> FormatWriter:
        return SpecForgeWriter(root, compress)

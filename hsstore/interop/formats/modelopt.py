"""NVIDIA Model-Optimizer's offline EAGLE cache: ``{conversation_id}.pt`` per sample.

Written by ``examples/speculative_decoding/collect_hidden_states/compute_hidden_states_hf.py`` with keys
``input_ids`` [T], ``hidden_states`` [T, H] (the target: transformers' last ``hidden_states`` entry,
post-norm), ``aux_hidden_states`` [T, n*H] (``hidden_states[i+1]`` of each ``--aux-layers`` id i),
``loss_mask`` [T], ``conversation_id``, and optionally ``hidden_states_prenorm`` (the producer's statement
that the target is pre-norm); read by ``modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset``
(every ``*.pt`` under the folder, ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from hsstore.core.errors import BadInput
from hsstore.interop.formats.interface import FormatWriter, TorchDictFormat, atomic_write, torch_bytes
from hsstore.interop.sample import FileDigest, SourceSample


class ModelOptWriter(FormatWriter):
    def rel(self, index: int, key: str) -> str:
        return f"{key}.pt"  # the conversation id is the sample's content key

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
            raise BadInput("Model-Optimizer's EAGLE-3 files need aux layers; the variant has none (export --aux ...)")
        record: dict[str, Any] = {
            "input_ids": ids,
            "hidden_states": target.contiguous(),
            "aux_hidden_states": aux.reshape(aux.shape[0], -1).contiguous(),
            "loss_mask": mask,
            "conversation_id": key,
        }
        if "prenorm" in claims:  # ModelOpt re-applies the final norm to a pre-norm target when told so
            record["hidden_states_prenorm"] = bool(claims["prenorm"])
        return atomic_write(self.root, self.rel(index, key), torch_bytes(record))


class ModelOpt(TorchDictFormat):
    name = "modelopt"
    tool = "Model-Optimizer"
    layout = "{conversation_id}.pt: torch.save dict input_ids, hidden_states, aux_hidden_states, loss_mask"
    loader = "modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset"
    suffixes = (".pt",)
    exported = re.compile(r"[0-9a-f]{32}\.pt")  # the sample's content key
    target_key, aux_key = "hidden_states", "aux_hidden_states"

    def read(self, root: Path, item: str) -> SourceSample:
        obj, digest = self.load(root, item)
        if "loss_mask" not in obj:
            raise BadInput(
                f"{item}: no 'loss_mask' (dumped without --answer-only-loss); hsstore keys samples by "
                "their mask and will not guess one — re-dump with --answer-only-loss"
            )
        ids, mask, aux, target = self.sample_states(obj, item)
        claims: dict[str, Any] = {}
        if "hidden_states_prenorm" in obj:
            claims["prenorm"] = bool(obj["hidden_states_prenorm"])
        return SourceSample(item, ids, mask, aux, target, [digest], claims)

    def writer(self, root: Path, compress: bool = False) -> FormatWriter:
        if compress:
            raise BadInput("Model-Optimizer reads plain .pt files; --compress is for specforge only")
        return ModelOptWriter(root)

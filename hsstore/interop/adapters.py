"""Training adapters: hsstore samples as the exact items and batches SpecForge's and speculators' trainers
consume, so a trainer swaps its offline dataset for an hsstore variant (with ``require=`` provenance
checks) in a few lines. Field names, shapes and dtypes follow their loaders (checked against the real
packages by ``scripts/check_interop_peers.py``):

- speculators (``speculators.train.data``): item ``hidden_states`` [T, n_aux*H], ``input_ids`` [T],
  ``verifier_last_hidden_states`` [T, H], ``loss_mask`` [T], ``lengths`` [1], ``position_ids`` [T];
  ``SpeculatorsCollate`` packs items into ``[1, max_len, ...]`` with ``document_ids`` like its ``CollateFn``.
- SpecForge (``OfflineEagle3Dataset.process_data``): item ``attention_mask``, ``loss_mask`` (last token 0),
  ``target`` [1, T, H], ``hidden_state`` [1, T, n_aux*H], ``input_ids`` [1, T]; ``SpecForgeCollate``
  right-pads like its ``DataCollatorWithPadding``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from hsstore.core.errors import BadInput

if TYPE_CHECKING:
    from hsstore.read.dataset import HiddenStateDataset, Required, StoreArg

Batch = dict[str, Any]


class _Adapter(Dataset[Batch]):
    """A HiddenStateDataset with one target layer and at least one aux layer, re-shaped per item."""

    def __init__(
        self,
        source: HiddenStateDataset | StoreArg,
        variant: str | None = None,
        require: Required | None = None,
        allow_drift: Iterable[str] = (),
        max_len: int | None = None,
    ) -> None:
        from hsstore.read.dataset import HiddenStateDataset

        if hasattr(source, "reader") and not isinstance(source, HiddenStateDataset):
            raise BadInput(
                f"{type(self).__name__} takes a HiddenStateDataset (map-style) or a store, not a "
                f"{type(source).__name__}"
            )
        self.base = (
            source
            if isinstance(source, HiddenStateDataset)
            else HiddenStateDataset(source, variant=variant, require=require, allow_drift=allow_drift)
        )
        if source is self.base and require is not None:  # a dataset given: its require= was its own
            self.base.check_required(require, allow_drift)
        roles = self.base.layer_roles
        if len(roles.get("target", [])) != 1 or not roles.get("aux"):
            raise BadInput(
                f"variant {self.base.variant_id} has layers {roles}; EAGLE-3 trainers need aux layers "
                "and exactly one target layer"
            )
        self.max_len = max_len

    def __len__(self) -> int:
        return len(self.base)

    @property
    def provenance(self) -> dict[str, Any]:
        return self.base.provenance

    @property
    def hidden_states_dtype(self) -> torch.dtype:
        from hsstore.core.dtypes import TORCH

        dtype: torch.dtype = TORCH[self.base.reader.record.dtype]  # (TORCH is built lazily: typed Any)
        return dtype

    @property
    def approx_lengths(self) -> list[int]:
        """Token count of each sample (speculators' batch sampler packs by these)."""
        r = self.base.reader
        return [min(r.refs[k].length, self.max_len or r.refs[k].length) for k in r.keys]

    def _raw(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids int64 [T], loss_mask int64 [T], aux [T, n*H], target [T, H]), cut to ``max_len``."""
        it = self.base[index]
        n = it["input_ids"].shape[0] if self.max_len is None else min(self.max_len, it["input_ids"].shape[0])
        aux = it["aux_hidden"][:n]
        return (
            it["input_ids"][:n],
            it["loss_mask"][:n].to(torch.int64),
            aux.reshape(n, -1),
            it["target_hidden"][:n, 0],
        )


class SpeculatorsDataset(_Adapter):
    """Items of ``speculators.train.data.BaseDataset`` (after ``__getitem__``), from an hsstore variant.

    Example: ``ds = SpeculatorsDataset("cache.zarr#dtype=bf16", max_len=4096)``, then speculators'
    ``_setup_dataloader(ds, total_seq_len, hidden_size)`` or ``DataLoader(ds, collate_fn=SpeculatorsCollate(...))``.
    """

    def __getitem__(self, index: int) -> Batch:
        ids, mask, aux, target = self._raw(index)
        n = ids.shape[0]
        return {
            "hidden_states": aux,
            "input_ids": ids,
            "verifier_last_hidden_states": target,
            "loss_mask": mask,
            "lengths": torch.tensor([n], dtype=torch.long),
            "position_ids": torch.arange(n, dtype=torch.long),
        }


class SpeculatorsCollate:
    """speculators' ``CollateFn``: items packed back to back into one ``[1, max_len, ...]`` row (hidden
    states cast to ``dtype``), ``document_ids`` (-1 = padding) and ``error_records``."""

    def __init__(
        self, max_len: int, dtype: torch.dtype = torch.bfloat16, preprocess: Callable[[Batch], Batch] | None = None
    ) -> None:
        self.max_len, self.dtype, self.preprocess = max_len, dtype, preprocess

    def __call__(self, items: Sequence[Batch | None]) -> Batch:
        batch = [self.preprocess(b) if self.preprocess else b for b in items if b is not None]
        if not batch:
            raise BadInput("an empty batch; SpeculatorsCollate packs at least one sample")
        out: Batch = {}
        for key in batch[0]:
            if key == "lengths":
                continue
            first = batch[0][key]
            buf = torch.zeros(
                (self.max_len, *first.shape[1:]), dtype=self.dtype if "hidden_states" in key else first.dtype
            )
            offset = 0
            for b in batch:
                rows = min(b[key].shape[0], self.max_len - offset)
                buf[offset : offset + rows] = b[key][:rows]
                offset += rows
                if offset == self.max_len:
                    break
            out[key] = buf.unsqueeze(0)
        out["document_ids"] = self._document_ids(torch.cat([b["lengths"] for b in batch]))
        out["error_records"] = len(items) - len(batch)
        return out

    def _document_ids(self, lengths: torch.Tensor) -> torch.Tensor:
        """Each packed position's sample index, -1 for padding (the last sample may be cut): [1, max_len]."""
        kept, total = [], 0
        for n in lengths.tolist():
            if n + total >= self.max_len:
                kept.append(self.max_len - total)
                break
            kept.append(n)
            total += n
        doc = torch.repeat_interleave(torch.arange(len(kept), dtype=torch.long), torch.tensor(kept, dtype=torch.long))
        pad = -torch.ones(self.max_len - doc.shape[0], dtype=torch.long)
        return torch.cat([doc, pad]).unsqueeze(0)


class SpecForgeDataset(_Adapter):
    """Items of ``specforge.data.preprocessing.OfflineEagle3Dataset`` (``process_data``), from a variant.

    Example: ``DataLoader(SpecForgeDataset("cache.zarr", max_len=2048), batch_size=4, collate_fn=SpecForgeCollate())``
    """

    def __init__(
        self,
        source: HiddenStateDataset | StoreArg,
        variant: str | None = None,
        require: Required | None = None,
        allow_drift: Iterable[str] = (),
        max_len: int = 2048,
    ) -> None:
        super().__init__(source, variant, require, allow_drift, max_len)

    def __getitem__(self, index: int) -> Batch:
        ids, mask, aux, target = self._raw(index)
        mask = mask.clone()
        mask[-1] = 0  # SpecForge never trains on the last position (no next token to predict)
        return {
            "attention_mask": torch.ones((1, ids.shape[0]), dtype=torch.long),
            "loss_mask": mask[None, :],
            "target": target[None, :],
            "hidden_state": aux[None, :],
            "input_ids": ids[None, :],
        }


class SpecForgeCollate:
    """SpecForge's ``DataCollatorWithPadding`` (no sequence parallelism): right-pad every field with zeros
    to the longest item: ``input_ids``/``attention_mask``/``loss_mask`` [B, N], ``hidden_state``
    [B, N, n*H], ``target`` [B, N, H]."""

    def __call__(self, items: Sequence[Batch]) -> Batch:
        n = max(it["input_ids"].shape[1] for it in items)

        def pad(t: torch.Tensor) -> torch.Tensor:
            extra = torch.zeros((t.shape[0], n - t.shape[1], *t.shape[2:]), dtype=t.dtype)
            return torch.cat((t, extra), dim=1)

        return {
            key: torch.cat([pad(it[key]) for it in items])
            for key in ("input_ids", "attention_mask", "loss_mask", "hidden_state", "target")
        }

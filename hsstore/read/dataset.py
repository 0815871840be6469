"""Datasets that read cached states with matched provenance: the map-style one, and what it shares with the
streaming one (DDP x workers: hsstore.read.streaming): opening a variant, ``require=``, items and ``pad_collate``.

Items: ``key``, ``input_ids`` [T] int64, ``loss_mask`` [T] bool, ``aux_hidden`` [T, n_aux, H] and
``target_hidden`` [T, n_target, H] in the stored dtype (bf16 stays torch.bfloat16). Only the requested
layers are read from disk. Variants stored in FP8 (``precision`` "fp8-e4m3") come back dequantized to
bf16 (exactly: hsstore.core.quant), or with ``raw=True`` as ``float8_e4m3fn`` codes plus ``aux_scales``
[T, n_aux, 1] and ``target_scales`` [T, n_target, 1] (float32; value = code * scale) for trainers that
dequantize on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from hsstore.core.errors import BadInput, ProvenanceMismatch
from hsstore.core.provenance_match import require_match
from hsstore.core.schema.reports import AuditSummary
from hsstore.read.prefetch_reads import Fetched, Lookahead
from hsstore.storage.info import audit_line, audits
from hsstore.storage.reader import VariantReader
from hsstore.storage.store import Store, split_target

# --- ``require=``: a dataset refuses a variant of other provenance than the one required — a provenance

# what ``require=`` takes: a provenance, a dataset (either form, or a training adapter over one:
# hsstore.interop.adapters), a reader or "STORE#SELECTOR"
Required: TypeAlias = "Mapping[str, Any] | DatasetBase | VariantReader | str"


def resolve_provenance(required: Required) -> dict[str, Any]:
    """A provenance from a dict, a dataset, a VariantReader or a 'STORE#SELECTOR' string."""
    if isinstance(required, Mapping):
        return dict(required)
    if isinstance(getattr(required, "reader", None), VariantReader):  # a HiddenStateDataset (either form)
        return cast(DatasetBase, required).provenance
    if isinstance(getattr(getattr(required, "base", None), "reader", None), VariantReader):
        return cast(DatasetBase, required.base).provenance  # type: ignore[union-attr]  # a training adapter's dataset
    if isinstance(required, VariantReader):
        return required.record.provenance
    if isinstance(required, str):
        path, sel = split_target(required)
        s = Store.open(path)
        return s.variant_record(s.select(sel)).provenance
    raise TypeError(
        f"require= takes a provenance dict, a dataset (or a training adapter over one), a reader or "
        f"'STORE#SELECTOR', not {type(required).__name__}"
    )


# --- Padding dataset items into a batch.

REQUIRED = ("input_ids", "loss_mask")
STATES = ("aux_hidden", "target_hidden", "aux_scales", "target_scales")
OPTIONAL = (
    "key",
    "index",
    "epoch",
    "epoch_start",
)  # a dataset's items carry them (epochs: streaming ones); kept when all do


def _check_items(items: Sequence[dict[str, Any]]) -> list[str]:
    """The fields every item has that the batch carries; BadInput naming the field and the item when an
    item lacks one the batch needs (``input_ids``, ``loss_mask``, or a state field the first item has)."""
    if not items:
        raise BadInput("pad_collate got no items; pass a non-empty list of dataset items")
    first = items[0]
    states = [k for k in STATES if k in first]
    for n, it in enumerate(items):
        missing = [k for k in (*REQUIRED, *states) if k not in it]
        if missing:
            raise BadInput(
                f"pad_collate: item {n} has no {', '.join(repr(k) for k in missing)} (it has "
                f"{sorted(it)}); pass items as HiddenStateDataset returns them, each with "
                f"{', '.join(REQUIRED)} and the same state fields"
            )
        # (a raw FP8 item after a dequantized one would be copied in as its codes' values, its scales dropped;
        # an fp32 item after a bf16 one rounded to bf16)
        other = [k for k in STATES if (k in it) != (k in first) or (k in it and _form(it[k]) != _form(first[k]))]
        if other:
            raise BadInput(
                f"pad_collate: item {n}'s {', '.join(repr(k) for k in other)} "
                f"({', '.join(_form(it[k]) if k in it else 'absent' for k in other)}) differ from item "
                f"0's ({', '.join(_form(first[k]) if k in first else 'absent' for k in other)}); batch "
                "items of one variant, one form (raw FP8 or not) and one choice of layers"
            )
    return [k for k in OPTIONAL if all(k in it for it in items)] + states


def _form(x: torch.Tensor) -> str:
    """A state's dtype and per-token shape (layers, hidden), as a batch must share them."""
    return f"{str(x.dtype).removeprefix('torch.')} {list(x.shape[1:])}"


def pad_collate(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Right-pad items into a batch with ``attention_mask`` (True = real token). ``key``, ``index``,
    ``epoch`` and ``epoch_start`` are carried when every item has them (items built outside a dataset may have
    none); an item without ``input_ids``, ``loss_mask`` or a state field the first item has is a BadInput naming it."""
    fields = _check_items(items)
    T = max(it["input_ids"].shape[0] for it in items)
    B = len(items)
    first = items[0]
    out: dict[str, Any] = {
        "input_ids": torch.zeros((B, T), dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.bool),
        "attention_mask": torch.zeros((B, T), dtype=torch.bool),
    }
    if "key" in fields:
        out["key"] = [it["key"] for it in items]
    for k in ("index", "epoch", "epoch_start"):
        if k in fields:
            out[k] = torch.tensor([it[k] for it in items], dtype=torch.long)
    padded = [k for k in STATES if k in fields]
    for k in padded:  # (float8 codes are padded through their bytes: zeros either way)
        x = first[k].view(torch.uint8) if first[k].dtype == torch.float8_e4m3fn else first[k]
        out[k] = torch.zeros((B, T, *x.shape[1:]), dtype=x.dtype)
    for b, it in enumerate(items):
        n = it["input_ids"].shape[0]
        out["input_ids"][b, :n] = it["input_ids"]
        out["loss_mask"][b, :n] = it["loss_mask"]
        out["attention_mask"][b, :n] = True
        for k in padded:
            out[k][b, :n] = it[k].view(torch.uint8) if it[k].dtype == torch.float8_e4m3fn else it[k]
    for k in padded:
        if first[k].dtype == torch.float8_e4m3fn:
            out[k] = out[k].view(torch.float8_e4m3fn)
    return out


# a dataset's store: an open Store, or its path or URL ("STORE#SELECTOR" too)
StoreArg: TypeAlias = "Store | str | os.PathLike[str]"


def _open(store: StoreArg, variant: str | None) -> VariantReader:
    variant = variant.strip() or None if isinstance(variant, str) else variant  # (variant="": none given)
    if isinstance(store, Store):
        s, sel = store, variant
    else:
        path, sel_in_path = split_target(str(store))
        s, sel = Store.open(path), variant if variant is not None else sel_in_path
        if variant is not None and sel_in_path and s.select(sel_in_path) != s.select(variant):
            raise BadInput(
                f"{store!r} names variant {s.select(sel_in_path)} but variant={variant!r} names "
                f"{s.select(variant)}; name one variant, in the path or in variant="
            )
    reader = s.reader(s.select(sel))
    reader.check_corrupt_commits()
    return reader


class DatasetBase:
    """What both datasets (this module's and hsstore.read.streaming's) share: opening, the provenance check and
    item assembly."""

    def _setup(
        self,
        store: StoreArg,
        variant: str | None,
        layers: Sequence[int] | None,
        require: Required | None,
        allow_drift: Iterable[str] | str | None,
        raw: bool = False,
    ) -> None:
        self.reader, self._pid, self.raw = _open(store, variant), os.getpid(), raw
        rec = self.reader.record
        if raw and not rec.stored_precision:
            raise BadInput(
                f"raw=True reads FP8 codes and scales; variant {self.reader.id} is stored as computed "
                f"({rec.dtype}): read it without raw=True"
            )
        stored = rec.all_layers
        if layers is not None and not list(layers):
            raise BadInput(f"layers=[] reads no state; pass some of the stored layers {stored}, or None for all")
        if layers is not None and len(set(layers)) != len(list(layers)):
            raise BadInput(
                f"layers={list(layers)} names a layer twice; items hold each layer once, in stored order "
                f"by role (aux, then target): pass each once"
            )
        want = stored if layers is None else sorted(set(layers))
        if bad := [i for i in want if i not in stored]:
            raise BadInput(f"layer(s) {bad} are not stored in variant {self.reader.id}; stored: {stored}")
        # layers are handed out by role, so a target layer can never end up among the conditioning ones
        self.layer_roles = {role: [i for i in ids if i in want] for role, ids in rec.layers.items()}
        if require is not None:
            self.check_required(require, allow_drift)

    def check_required(self, require: Required, allow_drift: Iterable[str] | str | None = ()) -> None:
        """ProvenanceMismatch unless the variant has the ``required`` provenance (``allow_drift``: fields that may
        differ; the message ends with the variant's audits); BadInput when a required dataset reads other layers."""
        try:
            require_match(self.reader.record.provenance, resolve_provenance(require), allow_drift)
        except ProvenanceMismatch as e:
            notes = [f"variant {self.reader.id}: {audit_line(a)}" for a in audits(self.reader.store, self.reader.id)]
            raise ProvenanceMismatch(e.differences, notes=notes) from None
        theirs = getattr(require, "layer_roles", getattr(getattr(require, "base", None), "layer_roles", None))
        if (
            isinstance(theirs, dict)
            and theirs != self.layer_roles
            and not {"layers", "recipe.layers"}
            & set([allow_drift] if isinstance(allow_drift, str) else allow_drift or ())
        ):  # a dataset's own choice
            raise BadInput(
                f"require= a dataset that reads layers {theirs}; this one reads {self.layer_roles}: pass "
                "layers= the same ones (or allow_drift=['layers'])"
            )

    @property
    def provenance(self) -> dict[str, Any]:
        return self.reader.record.provenance

    @property
    def audits(self) -> list[AuditSummary]:
        """What ``hsstore import --audit N`` found, oldest first: when, against which model, the verdict."""
        return audits(self.reader.store, self.reader.id)

    @property
    def precision(self) -> str | None:
        """How the states are stored when not as computed (e.g. "fp8-e4m3"), else None."""
        return self.reader.record.stored_precision

    def __getstate__(self) -> dict[str, Any]:
        # for spawn/forkserver workers: reopen the store there, reading the units this dataset opened with
        state = self.__dict__.copy()
        state.pop("_ahead", None)  # its thread and lock stay here: a worker starts its own
        state["reader"] = (self.reader.store.location, self.reader.id, list(self.reader.units))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        location, vid, units = state["reader"]
        self.__dict__.update(state)
        self.reader = VariantReader(Store.open(location), vid, units=units)
        self._pid = os.getpid()

    @property
    def hidden_size(self) -> int:
        return self.reader.record.hidden_size

    @property
    def variant_id(self) -> str:
        return self.reader.id

    def _reader_here(self) -> VariantReader:
        """The reader, reopened after a fork for remote stores (their clients are bound to the parent's
        event loop; local files are safe to share)."""
        pid = os.getpid()
        if getattr(self, "_pid", pid) != pid and not self.reader.store.is_local:
            self.reader = VariantReader(
                Store.open(self.reader.store.location), self.reader.id, units=list(self.reader.units)
            )
        self._pid = pid
        return self.reader

    def _item(self, index: int, fetched: Fetched | None = None) -> dict[str, Any]:
        self._reader_here()
        ref = self.reader.ref(index)
        ids, mask = self.reader.read_tokens(ref) if fetched is None else fetched.tokens
        item = {
            "key": ref.key,
            "index": index,
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(mask.astype(np.bool_)),
        }
        roles = ("aux", "target")
        groups = self.reader.read_groups(
            ref, [self.layer_roles.get(r, []) for r in roles], self.raw, None if fetched is None else fetched.chunks
        )
        for role, states in zip(roles, groups):  # all layers of the sample read in one pass
            if isinstance(states, tuple):  # raw FP8: codes and their scales
                item[f"{role}_hidden"], item[f"{role}_scales"] = states
            else:
                item[f"{role}_hidden"] = states
        return item


class HiddenStateDataset(DatasetBase, Dataset[dict[str, Any]]):
    """Map-style dataset over one variant; ``require=`` refuses a store of other provenance.

    Example: ``HiddenStateDataset("cache.zarr", variant="backend=torch,dtype=bf16", require=train.provenance)``
    """

    def __init__(
        self,
        store: StoreArg,
        variant: str | None = None,
        layers: Sequence[int] | None = None,
        require: Required | None = None,
        allow_drift: Iterable[str] | str | None = (),
        raw: bool = False,
    ) -> None:
        self._setup(store, variant, layers, require, allow_drift, raw)

    def __len__(self) -> int:
        return len(self.reader.keys)

    def __getitem__(self, index: int) -> dict[str, Any]:
        try:
            i = index.__index__()  # ints, numpy integers, 0-d integer tensors; never 1.5 or "3"
        except (AttributeError, TypeError):
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__} ({index!r})") from None
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} is out of range for {len(self)} samples")
        i, ahead = i % len(self), self._lookahead()
        fetched = ahead.take(i)
        try:
            return self._item(i, fetched)
        finally:
            ahead.done(fetched)

    def _lookahead(self) -> Lookahead:
        """This process's Lookahead over this reader (threads do not survive a fork)."""
        reader, ahead = self._reader_here(), self.__dict__.get("_ahead")
        if ahead is None or ahead.pid != os.getpid() or ahead.reader is not reader:
            ahead = self._ahead = Lookahead(reader, sorted({i for ids in self.layer_roles.values() for i in ids}))
        return ahead

    @property
    def keys(self) -> list[str]:
        return list(self.reader.keys)

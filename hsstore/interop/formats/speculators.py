"""vllm-project/speculators' offline cache: an Arrow dataset of tokens beside one safetensors file per row.

``DIR`` is a ``datasets`` ``save_to_disk`` folder with columns ``input_ids``, ``loss_mask`` (int64 lists)
and ``seq_len``, saved in torch format (what ``speculators prepare-data`` writes); ``DIR/hidden_states/
hs_{i}.safetensors`` holds row *i*'s ``hidden_states`` [T, n_layers, H] (aux layers in order, the target
last) and ``token_ids`` [T] (what vLLM's hidden-states connector writes). Read by
``speculators.train.data.ArrowDataset`` through ``hs_connectors.FileTransfer``.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hsstore.core.errors import BadInput
from hsstore.interop.formats.interface import TMP_SUFFIX, Format, FormatWriter, atomic_write
from hsstore.interop.sample import FileDigest, SourceSample, read_bytes, states, tokens, walk

HS_DIR = "hidden_states"
FP8_SCALES = "hidden_states_scales"  # hs_connectors.fp8_utils.SCALES_KEY


def hs_rel(index: int) -> str:
    return f"{HS_DIR}/hs_{index}.safetensors"


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No ``datasets`` progress bar inside hsstore's own output."""
    from datasets.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was:
            enable_progress_bars()


def _load_safetensors(data: bytes, rel: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as e:  # safetensors raises SafetensorError / ValueError on foreign bytes
        raise BadInput(f"{rel}: not a safetensors file ({str(e)[:160]})") from None


class SpeculatorsWriter(FormatWriter):
    def __init__(self, root: Path, compress: bool = False) -> None:
        from datasets import Features, List, Value
        from datasets.arrow_writer import ArrowWriter

        super().__init__(root)
        self.features = Features(
            {"input_ids": List(Value("int64")), "loss_mask": List(Value("int64")), "seq_len": Value("int64")}
        )
        self.rows_path = root / f".rows{TMP_SUFFIX}"
        self.rows = ArrowWriter(features=self.features, path=str(self.rows_path))
        self.lock = threading.Lock()
        self.pending: dict[int, dict[str, Any]] = {}
        self.next_row = 0

    def rel(self, index: int, key: str) -> str:
        return hs_rel(index)

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
        from safetensors.torch import save

        slots = [target.unsqueeze(1)] if aux is None else [aux, target.unsqueeze(1)]
        data = save({"hidden_states": torch.cat(slots, dim=1).contiguous(), "token_ids": ids.contiguous()})
        digest = atomic_write(self.root, self.rel(index, key), data)
        with self.lock:  # rows go into the Arrow table in index order, whatever order threads finish in
            self.pending[index] = {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": int(ids.numel())}
            while self.next_row in self.pending:
                self.rows.write(self.pending.pop(self.next_row))
                self.next_row += 1
        return digest

    def finish(self, n_samples: int) -> list[FileDigest]:
        from datasets import Dataset

        if self.pending or self.next_row != n_samples:
            raise RuntimeError(f"speculators export: {self.next_row} of {n_samples} rows written in order")
        self.rows.finalize()
        ds = Dataset.from_file(str(self.rows_path))
        ds.set_format(type="torch")  # what speculators' preprocessing saves: rows come back as tensors
        staging = self.root / f".dataset{TMP_SUFFIX}"
        shutil.rmtree(staging, ignore_errors=True)
        with _quiet_datasets():
            ds.save_to_disk(str(staging))
        del ds
        out = []
        for f in sorted(staging.iterdir()):
            (self.root / f.name).unlink(missing_ok=True)
            f.replace(self.root / f.name)
            out.append(read_bytes(self.root, f.name)[1])
        staging.rmdir()
        self.rows_path.unlink(missing_ok=True)
        return out


class Speculators(Format):
    name = "speculators"
    tool = "speculators"
    layout = "save_to_disk Arrow dataset (input_ids, loss_mask, seq_len) + hidden_states/hs_{i}.safetensors"
    loader = "speculators.train.data.ArrowDataset + hs_connectors.FileTransfer"
    suffixes = (".safetensors", ".arrow", ".json")
    exported = re.compile(r"hidden_states/hs_\d+\.safetensors|data-\d+-of-\d+\.arrow|state\.json|dataset_info\.json")

    def __init__(self) -> None:
        self.rows: Any = None
        self.lock = threading.Lock()
        self.missing = 0  # rows without a hidden-states file (speculators would generate them online)

    def _dataset(self, root: Path) -> Any:
        if self.rows is None:
            from datasets import load_from_disk

            if not (root / "state.json").is_file():
                raise BadInput(
                    f"{str(root)!r} is not a speculators data folder (no Arrow dataset: state.json is "
                    "missing); pass the folder `speculators prepare-data` wrote"
                )
            try:
                ds = load_from_disk(str(root))
            except Exception as e:
                raise BadInput(f"{str(root)!r}: cannot open the Arrow dataset ({str(e)[:160]})") from None
            missing = {"input_ids", "loss_mask"} - set(getattr(ds, "column_names", []) or [])
            if missing:
                raise BadInput(f"{str(root)!r}: the Arrow dataset lacks column(s) {sorted(missing)}")
            self.rows = ds.with_format("numpy")
        return self.rows

    def shared_files(self, root: Path) -> list[str]:
        """The Arrow dataset's own files: every sample's tokens and loss mask come from them."""
        return [
            f.name
            for f in sorted(root.iterdir())
            if f.is_file() and f.suffix in (".arrow", ".json") and f.name != "hsstore-export.json"
        ]

    def items(self, root: Path) -> list[str]:
        self.check_dir(root)
        n = len(self._dataset(root))
        names = walk(root / HS_DIR, (".safetensors",)) if (root / HS_DIR).is_dir() else []
        stems = (r[: -len(".safetensors")] for r in names)  # FileTransfer reads hidden_states/hs_{i}.safetensors
        have = {int(s[3:]) for s in stems if s.startswith("hs_") and s[3:].isdigit()}
        present = [i for i in range(n) if i in have]
        self.missing = n - len(present)
        return [str(i) for i in present]

    def read(self, root: Path, item: str) -> SourceSample:
        i = int(item)
        rel = hs_rel(i)
        with self.lock:
            row = self._dataset(root)[i]
        data, digest = read_bytes(root, rel)
        obj = _load_safetensors(data, rel)
        if FP8_SCALES in obj:
            raise BadInput(
                f"{rel}: FP8-quantized hidden states (hidden_states_scales); import their bf16 cache, "
                "FP8 caches are not imported yet"
            )
        if "hidden_states" not in obj or "token_ids" not in obj:
            raise BadInput(
                f"{rel}: no hidden_states/token_ids (keys: {', '.join(sorted(obj))}); is this a "
                "speculators hidden-states file?"
            )
        ids, mask = tokens(row["input_ids"], row["loss_mask"], f"row {i}")
        file_ids = obj["token_ids"].reshape(-1)
        if file_ids.numel() != len(ids) or not torch.equal(
            file_ids.to(torch.int64), torch.from_numpy(ids).to(torch.int64)
        ):
            raise BadInput(
                f"{rel}: its token_ids do not match row {i} of the Arrow dataset; the hidden states "
                "belong to another sample (speculators would skip it)"
            )
        hs = obj["hidden_states"]
        if hs.dim() != 3 or hs.shape[0] != len(ids):
            raise BadInput(f"{rel}: hidden_states has shape {tuple(hs.shape)}; expected [{len(ids)}, layers, hidden]")
        target = states(hs[:, -1], len(ids), rel, "hidden_states[:, -1]")
        aux = hs[:, :-1].contiguous()
        return SourceSample(f"row {i} ({rel})", ids, mask, aux, target, [digest])

    def writer(self, root: Path, compress: bool = False) -> FormatWriter:
        if compress:
            raise BadInput("speculators reads plain safetensors files; --compress is for specforge only")
        return SpeculatorsWriter(root)

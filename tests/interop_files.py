"""Caches written the way each tool writes them (its writer's code, not hsstore's), for import tests.

- SpecForge: scripts/prepare_hidden_states.py `_save_tensor_sync` + `_get_file_path`
- Model-Optimizer: collect_hidden_states/compute_hidden_states_hf.py `dump_hidden_states`
- speculators: `build_speculator_training_dataset` (map, set_format("torch"), save_to_disk) + vLLM's
  hidden-states connector (safetensors ``hidden_states`` [T, n, H], ``token_ids``)
- EAGLE: eagle/ge_data/ge_data_all_*.py `ge` + `writedata`
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import torch

TOKENIZER = "builtin:tiny-llama"  # 259 tokens, offline
VOCAB = 250


@dataclass
class Sample:
    ids: torch.Tensor  # int64 [T]
    mask: torch.Tensor  # int64 [T]
    aux: torch.Tensor  # [T, n, H]
    target: torch.Tensor  # [T, H]


def random_samples(
    n: int = 6, hidden: int = 32, n_aux: int = 3, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 7 + 3 * i
        out.append(
            Sample(
                torch.randint(0, VOCAB, (t,), generator=g),
                (torch.rand(t, generator=g) > 0.4).long(),
                torch.randn(t, n_aux, hidden, generator=g).to(dtype),
                torch.randn(t, hidden, generator=g).to(dtype),
            )
        )
    return out


def specforge_files(root: Path, samples: list[Sample], compress: bool = False, group: int = 2000) -> None:
    for idx, s in enumerate(samples):
        g = (idx // group) * group
        out = root / f"rows_{g}-{g + group}" / (f"data_{idx}.ckpt" + (".gz" if compress else ""))
        out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "input_ids": s.ids.clone(),
            "loss_mask": s.mask.clone(),
            "aux_hidden_state": s.aux.reshape(s.aux.shape[0], -1).clone().unsqueeze(0),
            "hidden_state": s.target.clone().unsqueeze(0),
        }
        if compress:
            with gzip.open(out, "wb", compresslevel=6) as f:
                torch.save(record, f)
        else:
            torch.save(record, out)


def modelopt_files(root: Path, samples: list[Sample], prenorm: bool | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for idx, s in enumerate(samples):
        record = {
            "input_ids": s.ids,
            "hidden_states": s.target,
            "aux_hidden_states": torch.cat([s.aux[:, j] for j in range(s.aux.shape[1])], dim=-1),
            "loss_mask": s.mask,
            "conversation_id": f"conv-{idx}",
        }
        if prenorm is not None:
            record["hidden_states_prenorm"] = prenorm
        with open(root / f"conv-{idx}.pt", "wb") as f:
            torch.save(record, f)


def speculators_files(root: Path, samples: list[Sample], skip_rows: tuple[int, ...] = ()) -> None:
    from datasets import Dataset
    from safetensors.torch import save_file

    ds = Dataset.from_dict(
        {
            "input_ids": [s.ids.tolist() for s in samples],
            "loss_mask": [s.mask.tolist() for s in samples],
            "seq_len": [len(s.ids) for s in samples],
        }
    )
    ds.set_format(type="torch")
    ds.save_to_disk(str(root))
    (root / "hidden_states").mkdir()
    for i, s in enumerate(samples):
        if i in skip_rows:
            continue
        hs = torch.cat([s.aux, s.target.unsqueeze(1)], dim=1)
        save_file(
            {"hidden_states": hs.contiguous(), "token_ids": s.ids}, str(root / "hidden_states" / f"hs_{i}.safetensors")
        )


def eagle_files(root: Path, samples: list[Sample], index: int = 0) -> None:
    name = root / str(index)
    for s in samples:
        os.makedirs(name, exist_ok=True)
        idx = len(os.listdir(name))
        torch.save({"input_ids": s.ids, "hidden_state": s.target, "loss_mask": s.mask}, f"{name}/data_{idx}.ckpt")


WRITERS = {
    "specforge": specforge_files,
    "modelopt": modelopt_files,
    "speculators": speculators_files,
    "eagle": eagle_files,
}

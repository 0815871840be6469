"""The peers' side of scripts/check_interop_peers.py: runs the REAL loaders of speculators, SpecForge,
Model-Optimizer and EAGLE (installed in a separate virtualenv, no hsstore there) on hsstore exports and
compares what they hand a trainer with what hsstore expects. Writes WORK/peer.json.

Usage: PEER_VENV/bin/python scripts/interop_peer_side.py WORK
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import shutil
import sys
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import torch

WORK = Path(sys.argv[1])
EXP = WORK / "expected"
RESULTS: dict = {"versions": {}, "checks": {}}


def check(name: str):
    def wrap(fn):
        try:
            detail = fn()
            RESULTS["checks"][name] = {"ok": True, "detail": detail}
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            RESULTS["checks"][name] = {
                "ok": False,
                "detail": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-2000:],
            }
        return fn

    return wrap


def same(a, b, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, (
            f"{what}: {getattr(a, 'dtype', a)} {tuple(a.shape)} vs {getattr(b, 'dtype', b)} {tuple(getattr(b, 'shape', ()))}"
        )
        assert torch.equal(a, b), f"{what}: values differ"
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"


RAW = torch.load(EXP / "raw.pt", weights_only=True)  # per sample: input_ids, loss_mask, aux [T, n*H], target [T, H]
BY_IDS = {tuple(r["input_ids"].tolist()): r for r in RAW}
META = json.loads((EXP / "meta.json").read_text())
for dist in (
    "speculators",
    "hs-connectors",
    "specforge",
    "nvidia-modelopt",
    "eagle-llm",
    "torch",
    "transformers",
    "datasets",
):
    RESULTS["versions"][dist] = md.version(dist)


@check("speculators: ArrowDataset + FileTransfer read the export; items equal hsstore's SpeculatorsDataset")
def _spec_items():
    from speculators.train.data import ArrowDataset

    ds = ArrowDataset(max_len=META["max_len"], datapath=str(WORK / "speculators"), on_missing="raise")
    want = torch.load(EXP / "speculators_items.pt", weights_only=True)
    assert len(ds) == len(want) == META["n"], (len(ds), len(want))
    for i in range(len(ds)):
        got = ds[i]
        assert list(got) == list(want[i]), (list(got), list(want[i]))
        for k in got:
            same(got[k], want[i][k], f"item {i} {k}")
    return f"{len(ds)} items, keys {list(want[0])}, approx_lengths equal: {ds.approx_lengths == META['lengths']}"


@check("speculators: CollateFn batch equals hsstore's SpeculatorsCollate")
def _spec_collate():
    from speculators.train.data import ArrowDataset, CollateFn

    ds = ArrowDataset(max_len=META["max_len"], datapath=str(WORK / "speculators"), on_missing="raise")
    want = torch.load(EXP / "speculators_batch.pt", weights_only=True)
    got = CollateFn(META["pack_len"], META["hidden"], num_target_layers=META["n_aux"])([ds[i] for i in range(4)])
    assert list(got) == list(want), (list(got), list(want))
    for k in got:
        same(got[k], want[k], f"batch {k}")
    return f"packed 4 samples into {tuple(got['hidden_states'].shape)}; keys {list(got)}"


@check("speculators: prepare-data code writes the Arrow table; its loader reads it with hsstore's hs files")
def _spec_prepare():
    from datasets import Dataset
    from speculators.data_generation.preprocessing import build_speculator_training_dataset
    from speculators.train.data import ArrowDataset

    rows = Dataset.from_dict(
        {"input_ids": [r["input_ids"].tolist() for r in RAW], "loss_mask": [r["loss_mask"].tolist() for r in RAW]}
    )
    ds = build_speculator_training_dataset(rows, processor=None, max_length=META["max_len"], num_proc=1)
    out = WORK / "speculators_native"
    ds.save_to_disk(str(out))
    shutil.copytree(WORK / "speculators" / "hidden_states", out / "hidden_states")
    read = ArrowDataset(max_len=META["max_len"], datapath=str(out), on_missing="raise")
    assert len(read) == len(RAW), f"prepare-data kept {len(read)} of {len(RAW)} rows"
    for i in range(len(read)):
        r = RAW[i]
        same(read[i]["input_ids"], r["input_ids"], f"row {i} input_ids")
        same(read[i]["verifier_last_hidden_states"], r["target"], f"row {i} target")
    return f"{len(read)} rows written by build_speculator_training_dataset + save_to_disk, read back"


@check("speculators: vocab mapping from hsstore's token_freq.pt equals hsstore's d2t/t2d")
def _spec_vocab():
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = torch.load(WORK / "vm" / "token_freq.pt", weights_only=True)
    size, vocab = META["draft_vocab"], META["target_vocab"]
    d2t, t2d = build_vocab_mappings_from_distribution(freq, size, vocab)
    same(d2t, torch.from_numpy(np.load(WORK / "vm" / f"d2t-{size}.npy")), "d2t")
    same(t2d, torch.from_numpy(np.load(WORK / "vm" / f"t2d-{size}.npy")), "t2d")
    return f"d2t [{size}] and t2d [{vocab}] identical"


@check("SpecForge: OfflineEagle3Dataset reads the export; items equal hsstore's SpecForgeDataset")
def _specforge():
    from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files
    from specforge.data.utils import DataCollatorWithPadding

    want = {tuple(w["input_ids"][0].tolist()): w for w in torch.load(EXP / "specforge_items.pt", weights_only=True)}
    ds = OfflineEagle3Dataset(list_local_files(str(WORK / "specforge")), max_len=META["max_len"])
    assert len(ds) == len(want)
    items = [ds[i] for i in range(len(ds))]
    for it in items:
        w = want[tuple(it["input_ids"][0].tolist())]
        assert list(it) == list(w), (list(it), list(w))
        for k in it:
            same(it[k], w[k], k)
    batch = DataCollatorWithPadding()(items[:4])
    return f"{len(ds)} items equal; collated { ({k: tuple(v.shape) for k, v in batch.items() if v is not None}) }"


@check("SpecForge: process_token_dict_to_mappings on the same counts picks the same draft vocabulary")
def _specforge_vocab():
    from specforge.data.preprocessing import process_token_dict_to_mappings

    freq = torch.load(WORK / "vm" / "token_freq.pt", weights_only=True)
    size, vocab = META["draft_vocab"], META["target_vocab"]
    d2t, t2d = process_token_dict_to_mappings(Counter(dict(sorted(freq.items()))), size, vocab)
    ours = torch.load(WORK / "vm" / f"vocab_mapping-{size}.pt", weights_only=True)
    same(d2t.long(), ours["d2t"], "d2t")
    same(t2d.bool(), ours["t2d"], "t2d")
    return "identical (counts fed in token-id order, so its first-appearance tie rule = hsstore's id rule)"


@check("Model-Optimizer: OfflineSupervisedDataset + EagleOfflineDataCollator read the export")
def _modelopt():
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset

    files = sorted(str(p) for p in (WORK / "modelopt").rglob("*.pt"))
    ds = OfflineSupervisedDataset(files, answer_only_loss=True)
    for i in range(len(ds)):
        it = ds[i]
        r = BY_IDS[tuple(it["input_ids"].tolist())]
        same(it["base_model_hidden_states"], r["target"], "hidden_states")
        same(it["aux_hidden_states"], r["aux"], "aux_hidden_states")
        same(it["loss_mask"], r["loss_mask"], "loss_mask")
        same(it["base_hidden_prenorm"], META["prenorm"], "base_hidden_prenorm")
    batch = EagleOfflineDataCollator(train_len=META["max_len"])([ds[i] for i in range(4)])
    return f"{len(ds)} files; prenorm flag {META['prenorm']}; batch aux {tuple(batch['base_model_outputs']['aux_hidden_states'].shape)}"


@check("EAGLE: CustomDataset (its source, from eagle/train/main.py) reads the ge_data export")
def _eagle():
    import eagle.train

    src = Path(eagle.train.__file__).with_name("main.py").read_text()
    tree = ast.parse(src)
    keep = [
        n
        for n in tree.body
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in ("CustomDataset", "list_files")
    ]
    ns = {
        "torch": torch,
        "Dataset": torch.utils.data.Dataset,
        "os": __import__("os"),
        "train_config": {"max_len": META["max_len"]},
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), "eagle/train/main.py", "exec"), ns)  # their code, verbatim
    files = ns["list_files"](str(WORK / "eagle"))
    ds = ns["CustomDataset"](files)
    for i in range(len(ds)):
        it = ds[i]
        r = next(r for r in RAW if torch.equal(r["target"], it["hidden_state_big"][0]))
        same(it["hidden_state_big"][0], r["target"], "hidden_state")
    return f"{len(ds)} files (list_files takes every file: the export record sits beside the folder)"


(WORK / "peer.json").write_text(json.dumps(RESULTS, indent=1))
print(json.dumps({k: v["ok"] for k, v in RESULTS["checks"].items()}, indent=1))

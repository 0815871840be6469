"""The README's examples run: the drafter training example under a real torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.process  # see docs/testing.md


def test_train_drafter_example_learns_and_refuses_mismatched_eval(tiny_store: Path, tmp_path: Path):
    out = tmp_path / "losses.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO / "scripts" / "train_drafter_example.py"),
        "--train",
        f"{tiny_store}#dtype=bf16",
        "--eval",
        f"{tiny_store}#dtype=bf16",
        "--mismatched",
        f"{tiny_store}#dtype=fp32",
        "--steps",
        "24",
        "--batch-tokens",
        "512",
        "--json",
        str(out),
    ]
    # 24 steps of 512 tokens span two epochs: the spawned DataLoader workers persist across the epoch boundary
    # (set_epoch and mark_consumed reach them), as a training loop keeps them
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["steps"] == 24 and res["epochs"] >= 2
    assert res["train_last"] < 0.7 * res["train_first"], res
    assert res["eval_last"] < res["eval_first"], res
    assert "environment.dtype: 'fp32' (store) != 'bf16' (required)" in res["refusal"]

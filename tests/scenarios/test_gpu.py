"""Multi-GPU builds on a machine with at least 2 CUDA GPUs (skipped elsewhere, CI included — these
run on the 2-GPU machine, see docs/benchmarks.md): ranks on their own GPUs, and one model spread over
two GPUs, both bit-identical to a one-GPU build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FLA_INSTALLED, REPO, write_manifest
from helpers import run_cli_process as run_cli

from hsstore import Store

# real processes (see docs/testing.md): the fla backend binds its kernels in a process of its own
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs 2 CUDA GPUs (run on the 2-GPU machine)",
    ),
]

# 8 layers, so a 2-GPU split has 4 per GPU, and wide enough that kernels are real GPU kernels
CONFIG = (
    "config = { hidden_size = 512, intermediate_size = 1024, num_hidden_layers = 8, linear_key_head_dim = 64, "
    "linear_value_head_dim = 64, head_dim = 64 }"
)
LAYERS = "{ aux = [1, 3, 5], target = [6] }"


def _manifest(tmp: Path, name: str, backend: str) -> Path:
    path = write_manifest(
        tmp / f"{name}.toml", store=str(tmp / f"{name}.zarr"), layers=LAYERS, extra_model=CONFIG, max_length=512
    )
    path.write_text(
        path.read_text()
        .replace('devices = ["cpu"]', 'devices = ["cuda"]')
        .replace('backends = ["torch"]', f'backends = ["{backend}"]')
    )
    return path


def _identical(a: Path, b: Path) -> dict:
    r = run_cli("diff", str(a), str(b), "--json", str(a.parent / "d.json"))
    assert r.returncode == 0, r.stderr
    d = json.loads((a.parent / "d.json").read_text())
    assert d["verdict"].startswith("identical") and d["only_a"] == d["only_b"] == 0, d["verdict"]
    return d


BACKENDS = ["torch"] + (["fla"] if FLA_INSTALLED else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_spread_over_two_gpus_matches_one_gpu(backend: str, tmp_path: Path):
    one = run_cli("build", str(_manifest(tmp_path, "one", backend)), "--quiet", "--json")
    assert one.returncode == 0, one.stderr
    two = run_cli("build", str(_manifest(tmp_path, "two", backend)), "--gpus-per-rank", "2", "--quiet", "--json")
    assert two.returncode == 0, two.stderr
    (v1,), (v2,) = json.loads(one.stdout)["variants"], json.loads(two.stdout)["variants"]
    assert v2["device"] == "cuda:0+cuda:1" and set(v2["peak_gpu_memory_gb"]) == {"cuda:0", "cuda:1"}
    assert v1["variant"] == v2["variant"], "the split is informational: same variant as one GPU"
    env = Store.open(tmp_path / "two.zarr").variants[0].provenance["environment"]
    assert [s["layers"] for s in env["model_parallel"]["stages"]] == [[0, 3], [4, 7]]
    _identical(tmp_path / "one.zarr", tmp_path / "two.zarr")


def test_two_ranks_on_two_gpus_match_one_rank(tmp_path: Path):
    one = run_cli("build", str(_manifest(tmp_path, "one", "torch")), "--quiet")
    assert one.returncode == 0, one.stderr
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hsstore",
        "build",
        str(_manifest(tmp_path, "two", "torch")),
        "--quiet",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    commits = Store.open(tmp_path / "two.zarr").reader(Store.open(tmp_path / "two.zarr").variant_ids()[0]).commits
    assert {c.writer.writer.split("-")[0] for c in commits} == {"r0", "r1"}
    _identical(tmp_path / "one.zarr", tmp_path / "two.zarr")

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from helpers import run_cli, write_manifest  # noqa: E402

from hsstore.build.backends import force_backend  # noqa: E402

# models loaded in this process run on the CPU, where fla's triton kernels cannot: bind transformers'
# reference kernels even where fla is installed (backend-specific tests build in subprocesses)
force_backend("torch")


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store built by the CLI from the bundled data: tiny hybrid model, bf16 and fp32 variants."""
    d = tmp_path_factory.mktemp("tiny")
    m = write_manifest(d / "m.toml", dtypes='["bf16", "fp32"]', layers="{ aux = [0, 1], target = [3] }")
    r = run_cli("build", str(m), "--limit", "40", "--quiet")
    assert r.returncode == 0, r.stderr
    return d / "store.zarr"


@pytest.fixture(scope="session")
def attn_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store of one tiny llama in three variants: bf16 with sdpa and with eager attention (two
    kernels of one recipe, the kind of pair diff exists for) and the fp32 sdpa floor."""
    d = tmp_path_factory.mktemp("attn")
    layers = "{ aux = [0, 1], target = [3] }"
    sdpa = write_manifest(d / "sdpa.toml", model="builtin:tiny-llama", dtypes='["bf16", "fp32"]', layers=layers)
    eager = write_manifest(d / "eager.toml", model="builtin:tiny-llama", dtypes='["bf16"]', layers=layers,
                           extra_model='attn_implementation = "eager"')
    for m in (sdpa, eager):
        r = run_cli("build", str(m), "--limit", "40", "--quiet")
        assert r.returncode == 0, r.stderr
    return d / "store.zarr"

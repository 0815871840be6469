"""numba's machine-code cache is an optimisation: where it cannot be saved the compiled loops still run."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import numpy as np, torch
from hsstore.compare.kernel import compiled_kernel
from hsstore.core.fp8_cpu import dequantize_bf16_bits
k = compiled_kernel()
a = np.array([[0.0, -2.5, 1.0], [0.0, 0.0, 3.0]], np.float32)
out, ulp, scratch = np.zeros((7, 2), np.float32), np.zeros(6), np.zeros((3, 3), np.float32)
k("_fused_rows", a, np.zeros_like(a), False, False, False, out, ulp, scratch)
assert out[2].tolist() == [2, 1] and out[1].tolist() == [2.5, 3.0] and out[0].tolist() == [3.5, 3.0], out
codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
a = dequantize_bf16_bits(codes, np.full((4, 1), 2.0, np.float32))
b = dequantize_bf16_bits(codes, np.full((4, 1), 2.0, np.float32), compiled=False)
assert (a == b).all()
print("ok", k._cached)
"""


def _tiny_files_only() -> None:
    """Files up to 256 bytes (what tempfile's probe writes); a larger write fails with EFBIG."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))


@pytest.mark.process  # a file-size limit is set on a process of its own
def test_loops_run_where_their_machine_code_cannot_be_saved(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env,
                       preexec_fn=_tiny_files_only, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "False"]  # the save failed, so the loops were compiled in process

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
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


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory made once per test run by ``build``, shared by every xdist worker of the run (the first
    to ask builds it under a file lock, the others wait for it): session stores are built once, not once
    per worker. Tests must treat it as read-only (copy it to change it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    d = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".done").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            build(d)
            (d / ".done").write_text("")
    return d


def _build_tiny(d: Path) -> None:
    m = write_manifest(d / "m.toml", dtypes='["bf16", "fp32"]', layers="{ aux = [0, 1], target = [3] }")
    r = run_cli("build", str(m), "--limit", "40", "--quiet")
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store built by the CLI from the bundled data: tiny hybrid model, bf16 and fp32 variants."""
    return shared_dir(tmp_path_factory, "tiny", _build_tiny) / "store.zarr"


@pytest.fixture(scope="session")
def attn_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store of one tiny llama in three variants: bf16 with sdpa and with eager attention (two
    kernels of one recipe, the kind of pair diff exists for) and the fp32 sdpa floor."""
    return shared_dir(tmp_path_factory, "attn", _build_attn) / "store.zarr"


def _build_attn(d: Path) -> None:
    layers = "{ aux = [0, 1], target = [3] }"
    sdpa = write_manifest(d / "sdpa.toml", model="builtin:tiny-llama", dtypes='["bf16", "fp32"]', layers=layers)
    eager = write_manifest(d / "eager.toml", model="builtin:tiny-llama", dtypes='["bf16"]', layers=layers,
                           extra_model='attn_implementation = "eager"')
    for m in (sdpa, eager):
        r = run_cli("build", str(m), "--limit", "40", "--quiet")
        assert r.returncode == 0, r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A moto S3 server on 127.0.0.1 and a bucket (tests need s3fs and moto, the test extras); AWS_*
    variables point every client (and child) at it."""
    pytest.importorskip("s3fs", reason="s3fs is part of the test extras (pip install -e '.[test]')")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    for _ in range(100):
        try:
            boto3.client("s3").create_bucket(Bucket="hsstore-test")
            break
        except Exception:  # noqa: BLE001 - the server is still starting
            time.sleep(0.1)
    else:
        server.kill()
        pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
    yield "s3://hsstore-test"
    server.terminate()
    server.wait(timeout=30)
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

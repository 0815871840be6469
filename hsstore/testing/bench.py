"""The formats the read benchmarks compare, written from the same samples: one torch.save file per sample
(and its map-style reader) and an hsstore store with a given codec (units of 8 samples)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np
import torch
from torch.utils.data import Dataset

from hsstore.core.keys import SampleTokens, sample_key
from hsstore.storage.codecs import chunk_tokens
from hsstore.storage.store import Store
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import AUX, BENCH_LAYERS, TARGET, config_toml, layers_toml, new_variant, provenance


def write_torch(d: Path, samples: list[SampleTokens], states: list[torch.Tensor]) -> None:
    """One ``i.pt`` per sample: input_ids, aux_hidden [T, 4, H], target_hidden [T, 1, H]."""
    for i, (s, st) in enumerate(zip(samples, states)):
        torch.save(
            {
                "input_ids": torch.from_numpy(s.input_ids),
                "aux_hidden": st[:, :4].clone(),
                "target_hidden": st[:, 4:].clone(),
            },
            d / f"{i}.pt",
        )


def write_hsstore(
    d: Path,
    samples: list[SampleTokens],
    states: list[torch.Tensor],
    codec: str,
    unit_samples: int = 8,
    chunk: int | None = None,
) -> None:
    """``d/s.zarr``: one bf16 variant with ``codec``, the samples in units of ``unit_samples``, chunks of
    ``chunk`` rows (default: what a build picks, ``chunk_tokens``)."""
    store = Store.create(d / "s.zarr")
    H = states[0].shape[-1]
    layers = {"aux": AUX, "target": TARGET}
    vid = store.create_variant(
        provenance("bf16", tok="bench", layers=layers, model=f"bench-{codec}"),
        layers,
        H,
        "bf16",
        codec,
        chunk or chunk_tokens(H, 2),
    )
    w = UnitWriter(store, vid, check_health=False)
    for a in range(0, len(samples), unit_samples):
        part = states[a : a + unit_samples]
        w.write(
            samples[a : a + unit_samples],
            {layer: torch.cat([s[:, j] for s in part]) for j, layer in enumerate(BENCH_LAYERS)},
        )


class TorchDS(Dataset[dict[str, torch.Tensor]]):
    """Map-style reader of ``write_torch``'s files (``torch.load``, weights only)."""

    def __init__(self, d: Path, n: int) -> None:
        self.d, self.n = d, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item: dict[str, torch.Tensor] = torch.load(self.d / f"{i}.pt", weights_only=True)
        return item


def write_tiny_store(
    path: Path, n_samples: int, unit_samples: int = 1000, length: int = 4, hidden: int = 8, seed: int = 0
) -> tuple[Store, str]:
    """A store at ``path`` with one bf16 variant (``factories.LAYERS``, width ``hidden``) of ``n_samples``
    distinct samples of ``length`` tokens, ``unit_samples`` to a unit, written straight through the
    UnitWriter (no model): the many-small-samples shape of a large DFlash run, built in seconds.
    Returns (store, variant id)."""
    store = Store.create(path)
    vid = new_variant(store, hidden=hidden, codec="none", chunk=4096)
    w = UnitWriter(store, vid, writer_id="tiny", check_health=False)
    base = np.random.default_rng(seed).integers(0, 250, length).astype(np.int32)
    mask = np.ones(length, np.uint8)
    rec = store.variant_record(vid)
    g = torch.Generator().manual_seed(seed)
    for a in range(0, n_samples, unit_samples):
        samples = []
        for i in range(a, min(n_samples, a + unit_samples)):
            ids = base.copy()
            ids[0] = i  # distinct token ids: distinct keys
            samples.append(SampleTokens(sample_key("tok", ids, mask), ids, mask))
        n = len(samples) * length
        w.write(
            samples,
            {layer: torch.randn(n, hidden, generator=g).to(torch.bfloat16) for layer in rec.all_layers},
            skip_committed=False,
        )
    return store, vid


# --- A baseline commit checked out beside this tree, for benchmarks that time both in the same run.


@contextmanager
def baseline_tree(repo: Path, rev: str, parent: str) -> Iterator[Path]:
    """``rev`` of ``repo`` as a detached git worktree under ``parent``; removed on exit."""
    base = Path(parent) / "baseline"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(base), rev], check=True, capture_output=True
    )
    try:
        yield base
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(base)], capture_output=True)


# --- Disk helpers of the read benchmarks: drop files from the page cache (cold reads), count their bytes, and

PROBE_READ = 16 << 20  # the probe's read size


def _files(path: Path) -> list[Path]:
    return [f for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file()]


def evict(path: Path) -> None:
    """Drop ``path`` (a file, or every file under a folder) from the page cache: clean after os.sync,
    so the next read comes from the disk."""
    os.sync()
    for f in _files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def du(path: Path) -> int:
    """Bytes of ``path`` (a file, or every file under a folder)."""
    return sum(f.stat().st_size for f in _files(path))


def write_probe(path: Path, size: int) -> None:
    """A file of ``size`` random bytes on the disk under test (written through, fsync'd)."""
    block = os.urandom(PROBE_READ)
    with open(path, "wb") as f:
        for _ in range(max(1, size // PROBE_READ)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def probe(path: Path) -> float:
    """The disk's sequential read rate (bytes/s): ``path`` evicted, then read once in 16 MiB reads."""
    evict(path)
    buf = bytearray(PROBE_READ)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0, off = time.perf_counter(), 0
        while n := os.preadv(fd, [buf], off):
            off += n
        return off / (time.perf_counter() - t0)
    finally:
        os.close(fd)


# --- The seed experiment's shared pieces (scripts/seed_experiment.py, gpu_fp8_seed.py, gpu_sampled_diff.py):

DATA = Path(__file__).resolve().parents[1] / "data" / "conversations.jsonl"
# size -> (its model shape in hsstore.testing.factories, max_length)
SIZES = {"tiny": ("tiny", 512), "gpu": ("1.6b", 2048)}


def sh(
    args: list[str], out: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (echoed), its stdout saved to ``out``; a failure ends the script with its output."""
    print("+", " ".join(args), flush=True)
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if out is not None:
        out.write_text(r.stdout)
    if r.returncode != 0 and check:
        print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"failed: {' '.join(args)}")
    return r


def hs(*args: str) -> list[str]:
    """The command line of ``hsstore ARGS`` in this interpreter."""
    return [sys.executable, "-m", "hsstore", *args]


def long_rows(n: int, short: int, max_len: int) -> str:
    """N text rows: the first ``short`` of ~max_len/8 bytes, the rest just under max_len bytes."""
    texts = []
    for line in DATA.read_text().splitlines():
        row = json.loads(line)
        turns = row.get("messages") or [{"content": t["value"]} for t in row["conversations"]]
        texts.append("\n".join(t["content"] for t in turns))
    blob = "\n\n".join(texts).encode()
    rows, pos = [], 0
    for i in range(n):
        size = max_len // 8 if i < short else max_len - 16
        chunk = blob[pos : pos + size]
        if len(chunk) < size:
            pos, chunk = 0, blob[:size]
        pos += size
        rows.append(json.dumps({"text": chunk.decode("utf-8", "ignore") + f" #{i}"}))
    return "\n".join(rows) + "\n"


def manifest(out: Path, data: Path, size: str, device: str, unit_tokens: int | None = None) -> Path:
    """OUT/seed.toml: the seed model of ``size`` over ``data``, torch bf16 on ``device``, into OUT/store.zarr."""
    shape, max_len = SIZES[size]
    units = f"unit_tokens = {unit_tokens}\n" if unit_tokens else ""
    m = out / "seed.toml"
    m.write_text(f"""[model]
path = "builtin:tiny-qwen3_5"
{config_toml(shape)}
layers = {layers_toml(shape)}
[data]
files = ["{data}"]
max_length = {max_len}
[build]
backends = ["torch"]
dtypes = ["bf16"]
devices = ["{device}"]
token_budget = 16384
{units}[store]
path = "{out / "store.zarr"}"
""")
    return m


# --- An S3 server on loopback for tests and benchmarks: moto in a subprocess, with one bucket (moto, boto3

_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
_SERVERS: dict[str, subprocess.Popen[bytes]] = {}  # s3://BUCKET -> its running server


def kill_server(url: str) -> None:
    """Kill the server behind ``url`` (a moto_s3 URL) now, mid-whatever: as a server that crashed or a
    network that went away; the context's exit then has nothing left to stop."""
    server = _SERVERS[url]
    server.kill()
    server.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _create_bucket(bucket: str, log: Path | None) -> None:
    """Make ``bucket`` once the server answers (it takes a moment to start); RuntimeError if it never does."""
    import boto3

    for _ in range(100):
        try:
            boto3.client("s3").create_bucket(Bucket=bucket)
            return
        except Exception:  # noqa: BLE001 - the server is still starting
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:] if log else '(no log kept)'}")


@contextmanager
def moto_s3(bucket: str, log: Path | None = None) -> Iterator[str]:
    """``s3://BUCKET`` on a moto server at 127.0.0.1: while the context lasts, the AWS_* variables point
    every client (and child process) at it; afterwards they are restored and the server stopped. The
    server's output goes to ``log`` if given."""
    port = _free_port()
    out: IO[str] | None = open(log, "w") if log is not None else None  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL if out is None else out,
        stderr=subprocess.STDOUT,
    )
    old = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(dict(zip(_ENV, ("testing", "testing", "us-east-1", f"http://127.0.0.1:{port}"))))
    _SERVERS[f"s3://{bucket}"] = server
    try:
        _create_bucket(bucket, log)
        yield f"s3://{bucket}"
    finally:
        _SERVERS.pop(f"s3://{bucket}", None)
        server.terminate()
        server.wait(timeout=30)
        if out is not None:
            out.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

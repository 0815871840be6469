"""The seed experiment's shared pieces (scripts/seed_experiment.py, gpu_fp8_seed.py, gpu_sampled_diff.py):
the model sizes, long text rows cut from the bundled conversations, the seed manifest, and running
``hsstore`` steps as subprocesses that stop the script with the command's output when one fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hsstore.testing.shapes import config_toml, layers_toml

DATA = Path(__file__).resolve().parents[1] / "data" / "conversations.jsonl"
# size -> (its model shape in hsstore.testing.shapes, max_length)
SIZES = {"tiny": ("tiny", 512), "gpu": ("1.6b", 2048)}


def sh(args: list[str], out: Path | None = None, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
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
        chunk = blob[pos: pos + size]
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
path = "{out / 'store.zarr'}"
""")
    return m

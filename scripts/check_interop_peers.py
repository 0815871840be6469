"""Proves hsstore's interop against the real packages: a native build is exported to all four formats,
the peers' own loaders read the exports in their own virtualenv (scripts/interop_peer_side.py), and
every export, plus an Arrow table written by speculators' own prepare-data code, is imported back and
compared bit-exactly with the native store. Results: docs/data/interop-peers.json, docs/interop.md.

Usage (scripts/check_interop_peers.sh makes both virtualenvs):
    .venv/bin/python scripts/check_interop_peers.py --peer-python .venv-peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hsstore import Store
from hsstore.interop.adapters import SpecForgeDataset, SpeculatorsCollate, SpeculatorsDataset
from hsstore.interop.exporter import ExportRequest, export_cache
from hsstore.interop.importer import ImportRequest, import_cache
from hsstore.interop.vocab import write_vocab_map

REPO = Path(__file__).resolve().parents[1]
MODEL = "builtin:tiny-llama"
MAX_LEN, PACK_LEN, DRAFT_VOCAB = 512, 384, 64


def build_native(work: Path, rows: int) -> Path:
    manifest = work / "m.toml"
    manifest.write_text(f'''[model]
path = "{MODEL}"
layers = {{ aux = [0, 1, 2], target = [3] }}
[data]
files = ["{REPO / "hsstore" / "data" / "conversations.jsonl"}"]
max_length = {MAX_LEN}
[build]
dtypes = ["bf16"]
[store]
path = "{work / "native.zarr"}"
''')
    r = subprocess.run(
        [sys.executable, "-m", "hsstore", "build", str(manifest), "--limit", str(rows), "--quiet"],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise SystemExit(f"native build failed: {r.stderr}")
    return work / "native.zarr"


def expected(store: Path, work: Path) -> dict:
    """What the peers' loaders must hand a trainer, computed by hsstore (raw arrays and adapter outputs)."""
    exp = work / "expected"
    exp.mkdir()
    s = Store.open(store)
    r = s.reader(s.select(None))
    aux, (target,) = r.record.layers["aux"], r.record.layers["target"]
    raw = []
    for key in r.keys:  # export order = the store's key order = speculators' row order
        ref = r.ref(key)
        ids, mask = r.read_tokens(ref)
        raw.append(
            {
                "input_ids": torch.from_numpy(ids.astype("int64")),
                "loss_mask": torch.from_numpy(mask.astype("int64")),
                "aux": r.read_stacked(ref, aux).reshape(ref.length, -1),
                "target": r.read_stacked(ref, [target])[:, 0],
            }
        )
    torch.save(raw, exp / "raw.pt")
    spec = SpeculatorsDataset(str(store), max_len=MAX_LEN)
    torch.save([spec[i] for i in range(len(spec))], exp / "speculators_items.pt")
    torch.save(SpeculatorsCollate(PACK_LEN)([spec[i] for i in range(4)]), exp / "speculators_batch.pt")
    sf = SpecForgeDataset(str(store), max_len=MAX_LEN)
    torch.save([sf[i] for i in range(len(sf))], exp / "specforge_items.pt")
    n_layers = r.record.provenance["recipe"]["model"]["num_layers"]
    meta = {
        "n": len(raw),
        "max_len": MAX_LEN,
        "pack_len": PACK_LEN,
        "hidden": r.record.hidden_size,
        "n_aux": len(aux),
        "lengths": [x["input_ids"].numel() for x in raw],
        "draft_vocab": DRAFT_VOCAB,
        "prenorm": target == n_layers - 1,
    }
    vm = write_vocab_map(str(store), DRAFT_VOCAB, str(work / "vm"))
    meta["target_vocab"] = vm["target_vocab_size"]
    (exp / "meta.json").write_text(json.dumps(meta))
    return meta


def bit_exact(a_path: Path, b_path: Path) -> str:
    """Every sample of A is in B with the same tokens, mask and states of every layer, bit for bit."""
    a, b = Store.open(a_path), Store.open(b_path)
    ra, rb = a.reader(a.select(None)), b.reader(b.select(None))
    assert sorted(ra.keys) == sorted(rb.keys), f"keys differ: {len(ra.keys)} vs {len(rb.keys)}"
    assert ra.record.layers == rb.record.layers, (ra.record.layers, rb.record.layers)
    layers = ra.record.all_layers
    for key in ra.keys:
        x, y = ra.read(key, layers), rb.read(key, layers)
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"]), key
        for i in layers:
            assert torch.equal(x["layers"][i].view(torch.int16), y["layers"][i].view(torch.int16)), (key, i)
    return f"{len(ra.keys)} samples, layers {ra.record.layers}: keys, tokens, masks and states bit-exact"


def round_trips(native: Path, work: Path) -> dict:
    out = {}
    for fmt in ("specforge", "modelopt", "speculators", "eagle"):
        name = f"round trip {fmt}: hsstore export -> hsstore import (statement from the export record)"
        try:
            rep = import_cache(ImportRequest(fmt, str(work / fmt), str(work / f"back-{fmt}.zarr"), tokenizer=MODEL))
            if fmt == "eagle":  # one slot only: compare the target layer
                out[name] = {
                    "ok": True,
                    "detail": f"{rep['samples']} samples, layers {rep['layers']}; "
                    + bit_exact_layers(native, work / f"back-{fmt}.zarr", rep["layers"]["target"]),
                }
            else:
                out[name] = {"ok": True, "detail": bit_exact(native, work / f"back-{fmt}.zarr")}
        except Exception as e:  # noqa: BLE001 - reported
            out[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
    name = "speculators prepare-data Arrow table + hs files -> hsstore import --layers 1,2,3,4 --capture input"
    try:
        import_cache(
            ImportRequest(
                "speculators",
                str(work / "speculators_native"),
                str(work / "back-native.zarr"),
                tokenizer=MODEL,
                model=MODEL,
                layers="1,2,3,4",
                capture="input",
            )
        )
        out[name] = {"ok": True, "detail": bit_exact(native, work / "back-native.zarr")}
    except Exception as e:  # noqa: BLE001
        out[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
    return out


def bit_exact_layers(a_path: Path, b_path: Path, layers: list[int]) -> str:
    a, b = Store.open(a_path), Store.open(b_path)
    ra, rb = a.reader(a.select(None)), b.reader(b.select(None))
    assert sorted(ra.keys) == sorted(rb.keys)
    for key in ra.keys:
        for i in layers:
            x, y = ra.read(key, [i])["layers"][i], rb.read(key, [i])["layers"][i]
            assert torch.equal(x.view(torch.int16), y.view(torch.int16)), (key, i)
    return f"layer(s) {layers} bit-exact"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", required=True, help="python of the virtualenv with the peer packages")
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--out", default=str(REPO / "docs" / "data" / "interop-peers.json"))
    args = ap.parse_args()
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="hsstore-peers-"))
    native = build_native(work, args.rows)
    meta = expected(native, work)
    exports = {
        fmt: export_cache(ExportRequest(str(native), fmt, str(work / fmt)))["tool_layers"]
        for fmt in ("specforge", "modelopt", "speculators", "eagle")
    }
    peer = subprocess.run(
        [args.peer_python, str(REPO / "scripts" / "interop_peer_side.py"), str(work)], capture_output=True, text=True
    )
    if not (work / "peer.json").is_file():
        raise SystemExit(f"the peer side failed: {peer.stderr[-3000:]}")
    peer_results = json.loads((work / "peer.json").read_text())
    checks = {**peer_results["checks"], **round_trips(native, work)}
    result = {
        "command": f"bash scripts/check_interop_peers.sh (rows={args.rows})",
        "peer_versions": peer_results["versions"],
        "native": {"model": MODEL, "samples": meta["n"], "layers": {"aux": [0, 1, 2], "target": [3]}},
        "exported_tool_layers": exports,
        "checks": checks,
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for c in checks.values():
        c.pop("traceback", None) if c["ok"] else None
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    failed = [k for k, c in checks.items() if not c["ok"]]
    for k, c in checks.items():
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {k}\n      {c['detail']}")
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

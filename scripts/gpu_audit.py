"""The audit on the seed experiment's 1.6 B hybrid (GPU): a store built with fla bf16 on the GPU, audited
against its model on 1 % of its samples with a live fp32 floor; then the same variant exported as a
speculators (vLLM-numbered) cache, imported as a foreign cache (no export record: the user states the
layers and --capture input), audited with nothing recorded about how it was computed (defaults: fla on
the GPU, bf16, sdpa, each sample alone); then that copy with three files damaged (NaN rows, a stale slot,
states shifted by one token), audited on the damaged samples.

    python scripts/gpu_audit.py --out /tmp/aud --rows 300                        # one GPU with fla
    python scripts/gpu_audit.py --out /tmp/aud --size tiny --device cpu --backend torch --rows 40   # dry run
    python scripts/gpu_audit.py --out /tmp/aud --steps build,native,import      # one call ...
    python scripts/gpu_audit.py --out /tmp/aud --steps imported --damaged       # ... and the next, same OUT
Everything lands in OUT/summary.json (times, verdicts, defect counts, the commands).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from hsstore.testing.bench import SIZES, hs, long_rows, manifest, sh
from hsstore.testing.factories import SHAPES

STEPS = ("build", "native", "import", "imported")


def timed(args: list[str], out: Path, check: bool = False) -> tuple[float, dict]:
    t = time.perf_counter()
    r = sh(args, out, check=check)
    took = time.perf_counter() - t
    try:
        return took, json.loads(r.stdout)
    except ValueError:
        return took, {"exit": r.returncode, "stderr": r.stderr[-800:]}


def damage(spec: Path, keys: list[int]) -> dict[str, int]:
    """Three speculators files damaged as vLLM bugs would: NaN rows, a stale slot (another row's bytes),
    states shifted by one token."""
    import torch
    from safetensors.torch import load_file, save_file

    nan, stale, shift = keys[:3]
    f = spec / "hidden_states"
    a = load_file(str(f / f"hs_{nan}.safetensors"))
    a["hidden_states"][3:7, -1] = float("nan")
    save_file(a, str(f / f"hs_{nan}.safetensors"))
    donor = load_file(str(f / f"hs_{shift}.safetensors"))["hidden_states"]
    b = load_file(str(f / f"hs_{stale}.safetensors"))
    n = min(b["hidden_states"].shape[0], donor.shape[0])
    b["hidden_states"][:n] = donor[:n]
    save_file(b, str(f / f"hs_{stale}.safetensors"))
    c = load_file(str(f / f"hs_{shift}.safetensors"))
    c["hidden_states"] = torch.roll(c["hidden_states"], 1, 0).contiguous()
    save_file(c, str(f / f"hs_{shift}.safetensors"))
    return {"nan": nan, "stale_copy": stale, "token_shift": shift}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/aud")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="fla")
    ap.add_argument("--damaged", action="store_true", help="also audit a copy with three damaged files")
    ap.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"which of {','.join(STEPS)} to run (a later call reuses OUT, to split the run over two calls)",
    )
    args = ap.parse_args()
    steps = set(args.steps.split(","))
    if steps - set(STEPS):
        raise SystemExit(f"--steps: unknown {sorted(steps - set(STEPS))}; choose from {','.join(STEPS)}")
    out = Path(args.out)
    if "build" in steps:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / "long.jsonl").write_text(long_rows(args.rows, args.rows // 4, SIZES[args.size][1]))
    m = manifest(out, out / "long.jsonl", args.size, args.device)
    shape, aux, target = SHAPES[SIZES[args.size][0]][0], *SHAPES[SIZES[args.size][0]][1:]
    n_layers = shape.get("num_hidden_layers", 4) if shape else 4
    summary = out / "summary.json"
    s = (
        json.loads(summary.read_text())
        if summary.exists() and "build" not in steps
        else {"rows": args.rows, "commands": []}
    )
    native, spec = f"{out / 'store.zarr'}#backend={args.backend}", out / "spec"
    ids = ",".join(str(i + 1) for i in [*aux, *target])  # vLLM's numbering: the state entering layer i
    if "build" in steps:
        t = time.perf_counter()
        sh(hs("build", str(m), "--backend", args.backend, "--quiet"))
        s["build_s"] = time.perf_counter() - t
    if "native" in steps:
        cmd = hs(
            "check", str(m), native, "--fraction", "0.01", "--floor", "live", "--device", args.device, "--json", "-"
        )
        s["commands"].append(" ".join(cmd[2:]))
        s["native_s"], s["native"] = timed(cmd, out / "native.json")
    if "import" in steps:
        imported_copy(native, spec, out / "imported.zarr", ids, n_layers)
    if "imported" in steps:
        cmd = hs("check", str(m), str(out / "imported.zarr"), "--fraction", "0.01", "--json", "-")
        s["commands"].append(" ".join(cmd[2:]))
        s["imported_s"], s["imported"] = timed(cmd, out / "imported.json")
    if args.damaged:
        damaged(spec, out, m, ids, n_layers, s)
    brief = {
        k: (
            {
                f: v.get(f)
                for f in (
                    "verdict",
                    "verdict_kind",
                    "samples",
                    "population",
                    "defects",
                    "bound",
                    "assumed",
                    "recompute",
                    "seconds",
                )
            }
            if isinstance(v, dict) and "verdict_kind" in v
            else v
        )
        for k, v in s.items()
    }
    summary.write_text(json.dumps(brief, indent=1, default=str))
    print(json.dumps(brief, indent=1, default=str))


def imported_copy(native: str, spec: Path, imported: Path, ids: str, n_layers: int) -> None:
    """The native variant exported as a speculators cache, its export record removed (a foreign cache: nothing
    says what it holds), imported with the user's statement of layers and capture point alone."""
    sh(hs("export", native, "speculators", str(spec)))
    (spec / "hsstore-export.json").unlink()
    sh(
        hs(
            "import",
            "speculators",
            str(spec),
            "--store",
            str(imported),
            "--tokenizer",
            "builtin:tiny-qwen3_5",
            "--num-layers",
            str(n_layers),
            "--layers",
            ids,
            "--capture",
            "input",
            "--quiet",
        )
    )


def damaged(spec: Path, out: Path, m: Path, ids: str, n_layers: int, s: dict) -> None:
    """The speculators copy with three files damaged, imported again and audited on its first 8 samples."""
    s["damaged_files"] = damage(spec, [0, 1, 2])
    broken = out / "damaged.zarr"
    sh(
        hs(
            "import",
            "speculators",
            str(spec),
            "--store",
            str(broken),
            "--tokenizer",
            "builtin:tiny-qwen3_5",
            "--num-layers",
            str(n_layers),
            "--layers",
            ids,
            "--capture",
            "input",
            "--allow-unhealthy",
            "--limit",
            "8",
            "--quiet",
        )
    )
    cmd = hs("check", str(m), str(broken), "--samples", "8", "--json", "-")
    s["commands"].append(" ".join(cmd[2:]))
    s["damaged_s"], s["damaged"] = timed(cmd, out / "damaged.json")


if __name__ == "__main__":
    main()

"""FP8 storage on the seed experiment's 1.6 B hybrid (GPU): its error against the bf16-vs-fp32 floor and
the fla-vs-torch divergence, diff's verdicts, GPU vs CPU quantization, and bf16 vs FP8 training.

    python scripts/gpu_fp8_seed.py --out /tmp/seed8 --rows 40          # on one GPU with fla installed
    python scripts/gpu_fp8_seed.py --out /tmp/s8 --size tiny --device cpu --no-fla --rows 8 --steps 5   # dry run

One store (OUT/store.zarr) of ``--rows`` long text rows (~2,000 tokens each): torch-fallback bf16 and
fp32, fla bf16, and fla bf16 stored as FP8 at build time (quantized on the GPU); the torch bf16 variant
converted to FP8 (``hsstore convert``, on the CPU); the fla bf16 variant converted into a second store,
whose codes must equal the GPU-quantized variant's (``hsstore diff``: identical). Diffs against the
torch fp32 floor, ``hsstore info --json``, and scripts/train_drafter_example.py on the torch bf16 variant
and its FP8 twin (same seed, same samples in the same units: the storage precision is the only
difference). Everything lands in OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hsstore.testing.bench import SIZES, hs, long_rows, manifest, sh

REPO = Path(__file__).resolve().parents[1]
FP8 = "precision=fp8-e4m3"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/seed8")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--quant-only",
        action="store_true",
        help="only fla bf16 and FP8 builds: GPU vs CPU quantization, and check on the FP8 variant",
    )
    ap.add_argument(
        "--train-only",
        action="store_true",
        help="only the torch bf16 build, its FP8 conversion and the bf16-vs-FP8 training comparison",
    )
    ap.add_argument("--no-fla", action="store_true", help="torch fallback only (a dry run where fla cannot run)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "long.jsonl"
    data.write_text(long_rows(args.rows, 0, SIZES[args.size][1]))
    m = manifest(out, data, args.size, args.device)
    dev = ["--device", args.device]
    S = out / "store.zarr"
    summary: dict = {"rows": args.rows}
    kernel = "torch" if args.no_fla else "fla"  # the backend of the "other kernels" variants
    builds = {
        "torch": ["--backend", "torch", "--dtype", "bf16", "--dtype", "fp32"],
        "kernels": ["--backend", kernel, "--dtype", "bf16"],
        "kernels-fp8": ["--backend", kernel, "--dtype", "bf16", "--precision", "fp8-e4m3"],
    }
    if args.quant_only:  # GPU-quantized (build) against CPU-quantized (convert) codes, and check on FP8
        builds.pop("torch")
    if args.train_only:
        builds = {"torch": ["--backend", "torch", "--dtype", "bf16"]}
    for name, extra in builds.items():
        t0 = time.perf_counter()
        r = sh(hs("build", str(m), "--quiet", "--json", *extra))
        summary[f"build_{name}"] = json.loads(r.stdout)
        print(f"build {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    torch_bf16, torch_fp32 = f"{S}#backend=torch,dtype=bf16", f"{S}#backend=torch,dtype=fp32"
    fla_bf16, fla_fp8 = f"{S}#backend={kernel},dtype=bf16", f"{S}#backend={kernel},{FP8}"
    if args.quant_only:
        conv = out / "conv.zarr"
        summary["convert_fla"] = json.loads(
            sh(hs("convert", fla_bf16, "--precision", "fp8-e4m3", "--store", str(conv), "--json", "--quiet")).stdout
        )
        r = sh(hs("diff", fla_fp8, str(conv), "--json", "-"), check=False)
        summary["diff_gpu_vs_cpu_quantization"] = (
            r.stdout.strip().startswith("{") and json.loads(r.stdout) or r.stderr[-800:]
        )
        r = sh(hs("check", str(m), fla_fp8, "--samples", "4", *dev, "--json", "-"), check=False)
        summary["check_fp8"] = r.stdout.strip().startswith("{") and json.loads(r.stdout) or r.stderr[-800:]
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        for name in ("diff_gpu_vs_cpu_quantization", "check_fp8"):
            v = summary[name]
            print(name, v.get("verdict_kind"), [L["bit_exact"] for L in v["layers"]] if isinstance(v, dict) else v)
        return
    summary["convert_torch"] = json.loads(
        sh(hs("convert", torch_bf16, "--precision", "fp8-e4m3", "--json", "--quiet")).stdout
    )
    if args.train_only:
        train_both(out, S, torch_bf16, dev, args.steps, summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return
    conv = out / "conv.zarr"
    summary["convert_fla"] = json.loads(
        sh(hs("convert", fla_bf16, "--precision", "fp8-e4m3", "--store", str(conv), "--json", "--quiet")).stdout
    )
    # A is the variant as computed and B the one judged: diff's floor is A against C, so with A = the bf16
    # states it is the bf16-vs-fp32 floor (with A = the FP8 states it would include the FP8 error itself)
    diffs = {
        "fp8_vs_torch_bf16": (torch_bf16, f"{S}#backend=torch,{FP8}"),
        "fla_vs_torch_bf16": (torch_bf16, fla_bf16),
        "fla_fp8_vs_fla_bf16": (fla_bf16, fla_fp8),
    }
    for name, (a, b) in diffs.items():
        r = sh(hs("diff", a, b, "--floor", torch_fp32, *dev, "--json", "-"), check=False)
        summary[f"diff_{name}"] = (
            json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"error": r.stderr[-800:]}
        )
    # GPU-quantized (build) vs CPU-quantized (convert) codes of the same fla bf16 states
    r = sh(hs("diff", fla_fp8, str(conv), "--json", "-"), check=False)
    summary["diff_gpu_vs_cpu_quantization"] = (
        json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"error": r.stderr[-800:]}
    )
    summary["info"] = json.loads(sh(hs("info", str(S), "--json")).stdout)
    train_both(out, S, torch_bf16, dev, args.steps, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    report(summary)


def train_both(out: Path, S: Path, torch_bf16: str, dev: list[str], steps: int, summary: dict) -> None:
    """scripts/train_drafter_example.py on the torch bf16 variant and on its FP8 conversion, same seed."""
    for name, target in (("bf16", torch_bf16), ("fp8", f"{S}#backend=torch,{FP8}")):
        js = out / f"train-{name}.json"
        t0 = time.perf_counter()
        sh(
            [
                sys.executable,
                str(REPO / "scripts" / "train_drafter_example.py"),
                "--train",
                target,
                "--eval",
                target,
                "--steps",
                str(steps),
                "--batch-tokens",
                "8192",
                "--workers",
                "2",
                *dev,
                "--json",
                str(js),
            ]
        )
        summary[f"train_{name}"] = json.loads(js.read_text())
        summary[f"train_{name}"].pop("provenance", None)
        summary[f"train_{name}_seconds"] = time.perf_counter() - t0
        t = summary[f"train_{name}"]
        print(
            f"train {name}: {summary[f'train_{name}_seconds']:.1f} s; loss {t['train_first']:.3f} -> "
            f"{t['train_last']:.3f}; eval {t['eval_first']:.3f} -> {t['eval_last']:.3f}",
            flush=True,
        )


def report(s: dict) -> None:
    for name in ("fp8_vs_torch_bf16", "fla_vs_torch_bf16", "fla_fp8_vs_fla_bf16"):
        d = s[f"diff_{name}"]
        print(f"\n{name}: {d.get('verdict', d.get('error'))}")
        for L in d.get("layers", []):
            print(
                f"  layer {L['layer']:3d} rel-L2 {L['rel_l2']:.3e}  floor {L.get('floor_rel_l2', float('nan')):.3e}"
                f"  x{L.get('floor_ratio', float('nan')):.2f}  cos_mean {L['cos_mean']:.6f}  {L.get('verdict', '')}"
            )
    print(f"\nGPU vs CPU quantization: {s['diff_gpu_vs_cpu_quantization'].get('verdict')}")
    for name in ("bf16", "fp8"):
        t = s[f"train_{name}"]
        print(
            f"train {name}: loss {t['train_first']:.3f} -> {t['train_last']:.3f}; eval {t['eval_first']:.3f} -> "
            f"{t['eval_last']:.3f}"
        )


if __name__ == "__main__":
    main()

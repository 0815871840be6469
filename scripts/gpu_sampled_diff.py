"""A 1 % sampled diff against the full diff on the seed experiment's stores (issue 20's acceptance run).

    python scripts/gpu_sampled_diff.py --out /tmp/sampled --rows 1000            # one GPU with fla
    python scripts/gpu_sampled_diff.py --out /tmp/sd --size tiny --device cpu --no-fla --rows 200   # dry run

One store of ``--rows`` text rows of the seed model (nine in ten ~256 tokens, one in ten ~2,000: the
length strata matter): torch-fallback bf16 and fp32, fla bf16. The full fla-vs-torch diff against the
fp32 floor, then ``--fraction 0.01`` with several seeds; for each seed: is the verdict the full diff's,
and does each layer's interval cover the full diff's rel-L2 and floor ratio. OUT/sampled-summary.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hsstore.testing.bench import SIZES, hs, long_rows, manifest, sh


def diff(a: str, b: str, c: str, *extra: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = sh(hs("diff", a, b, "--floor", c, *extra, "--json", "-"), check=False)
    rep = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"error": r.stderr[-800:]}
    return rep, time.perf_counter() - t0


def covers(full: dict, sampled: dict) -> dict:
    """Per layer: does the sampled interval hold the full diff's value (rel-L2, floor ratio)?"""
    out = {}
    for F, S in zip(full["layers"], sampled["layers"]):
        ci = S.get("ci", {})
        out[str(F["layer"])] = {
            name: (ci[name][0] <= F[name] <= ci[name][1]) if name in ci else None for name in ("rel_l2", "floor_ratio")
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/sampled")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fp8", action="store_true", help="also convert A to FP8 and diff it against A with the floor")
    ap.add_argument("--no-fla", action="store_true", help="torch fallback only (a dry run where fla cannot run)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "rows.jsonl"
    data.write_text(long_rows(args.rows, args.rows - args.rows // 10, SIZES[args.size][1]))
    m = manifest(out, data, args.size, args.device)
    # the pair of kernels: fla against the torch fallback; in a dry run (no fla), eager against sdpa attention
    other = m.with_name("other.toml")
    other.write_text(
        m.read_text().replace("[model]\n", '[model]\nattn_implementation = "eager"\n') if args.no_fla else m.read_text()
    )
    summary: dict = {"rows": args.rows, "fraction": args.fraction}
    for name, man, extra in (
        ("torch", m, ["--backend", "torch", "--dtype", "bf16", "--dtype", "fp32"]),
        ("kernels", other, ["--backend", "torch" if args.no_fla else "fla", "--dtype", "bf16"]),
    ):
        t0 = time.perf_counter()
        r = sh(hs("build", str(man), "--quiet", "--json", *extra))
        summary[f"build_{name}"] = {"seconds": time.perf_counter() - t0, **json.loads(r.stdout)}
    S = out / "store.zarr"
    base = "attention=sdpa," if args.no_fla else "backend=torch,"
    b_sel = "attention=eager," if args.no_fla else "backend=fla,"
    a, b, c = f"{S}#{base}dtype=bf16", f"{S}#{b_sel}dtype=bf16", f"{S}#{base}dtype=fp32"
    save = lambda: (out / "sampled-summary.json").write_text(json.dumps(summary, indent=1, default=str))  # noqa: E731
    save()
    full, secs = diff(a, b, c, "--device", args.device)
    summary["full"] = {"seconds": secs, "report": full}
    save()
    runs = summary["sampled"] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        rep, secs = diff(a, b, c, "--device", args.device, "--fraction", str(args.fraction), "--seed", str(seed))
        same = rep.get("verdict_kind") == full.get("verdict_kind")
        runs.append(
            {
                "seed": seed,
                "seconds": secs,
                "samples": rep.get("sampling", {}).get("samples"),
                "verdict_kind": rep.get("verdict_kind"),
                "same_verdict": same,
                "covers": covers(full, rep) if "layers" in rep else None,
                "report": rep,
            }
        )
        save()
    if args.fp8:  # the torch bf16 states converted to FP8: their error against the bf16-vs-fp32 floor
        t0 = time.perf_counter()
        summary["convert"] = json.loads(sh(hs("convert", a, "--precision", "fp8-e4m3", "--json", "--quiet")).stdout)
        summary["convert"]["seconds"] = time.perf_counter() - t0
        fp8 = a.replace("dtype=bf16", "precision=fp8-e4m3")
        summary["fp8_diff"] = diff(a, fp8, c, "--device", args.device)[0]
        summary["info"] = json.loads(sh(hs("info", str(S), "--json")).stdout)
        save()
    print(
        f"full diff: {full.get('verdict_kind')} in {summary['full']['seconds']:.1f} s "
        f"({full.get('shared_samples')} samples)"
    )
    for r in runs:
        print(
            f"seed {r['seed']}: {r['samples']} samples, {r['verdict_kind']} (same: {r['same_verdict']}) in "
            f"{r['seconds']:.1f} s; covers {r['covers']}"
        )


if __name__ == "__main__":
    main()

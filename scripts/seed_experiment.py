"""The seed experiment: torch-fallback vs fla states of one hybrid (Gated-DeltaNet) model, judged by
hsstore diff against the bf16-vs-fp32 floor. Runs what this machine can and says what it skipped.

    python scripts/seed_experiment.py --out out/seed                    # tiny model, CPU part
    python scripts/seed_experiment.py --out out/seed --size gpu        # hidden 2048, 24 layers, on a GPU

Writes OUT/store.zarr, OUT/*.json (build summaries, diffs, env probes), OUT/*.png and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hsstore.testing.bench import DATA, SIZES, hs, long_rows, manifest, sh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/seed")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--cpu-limit", type=int, default=16, help="samples for the CPU variants (a subset)")
    ap.add_argument("--limit", type=int, default=None, help="samples for the GPU variants")
    ap.add_argument(
        "--long-rows",
        type=int,
        default=0,
        help="use N long text rows (near max_length) built from the bundled conversations; the "
        "first --cpu-limit rows are kept short so the CPU subset stays cheap",
    )
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    store = out / "store.zarr"
    max_len = SIZES[args.size][1]
    data = DATA
    if args.long_rows:
        data = out / "long.jsonl"
        data.write_text(long_rows(args.long_rows, args.cpu_limit, max_len))
    manifest_path = manifest(out, data, args.size, "cpu", unit_tokens=65536)
    import torch

    gpu = torch.cuda.is_available()
    from hsstore.capture.model.kernels import installed

    fla = installed("fla")
    skipped, builds = [], {}

    def build(name: str, *opts: str, limit: int | None) -> None:
        lim = ["--limit", str(limit)] if limit else []
        sh(hs("build", str(manifest_path), *opts, *lim, "--quiet", "--json"), out / f"build-{name}.json")
        builds[name] = json.loads((out / f"build-{name}.json").read_text())

    build("cpu-torch-bf16", "--device", "cpu", "--dtype", "bf16", limit=args.cpu_limit)
    build("cpu-torch-fp32", "--device", "cpu", "--dtype", "fp32", limit=args.cpu_limit)
    if gpu:
        build(
            "cuda-torch",
            "--device",
            "cuda",
            "--backend",
            "torch",
            "--dtype",
            "bf16",
            "--dtype",
            "fp32",
            limit=args.limit,
        )
        if fla:
            build(
                "cuda-fla",
                "--device",
                "cuda",
                "--backend",
                "fla",
                "--dtype",
                "bf16",
                "--dtype",
                "fp32",
                limit=args.limit,
            )
        else:
            skipped.append("fla variants: the fla package is not installed here")
    else:
        skipped.append("every CUDA variant (no GPU here): torch-fallback and fla on CUDA, and their diffs")

    diffs = []

    def diff(name: str, a: str, b: str, floor: str | None) -> None:
        cmd = hs(
            "diff",
            f"{store}#{a}",
            f"{store}#{b}",
            "--json",
            str(out / f"diff-{name}.json"),
            "--plot",
            str(out / f"diff-{name}.png"),
            "--device",
            "cuda" if gpu else "cpu",
        )
        if floor:
            cmd += ["--floor", f"{store}#{floor}"]
        sh(cmd, out / f"diff-{name}.txt")
        diffs.append((name, a, b, floor, json.loads((out / f"diff-{name}.json").read_text())))

    # the floor itself (bf16 against fp32): no floor of its own (diff refuses a floor that is A or B)
    diff("cpu-bf16-vs-fp32", "device=cpu,dtype=bf16", "device=cpu,dtype=fp32", None)
    if gpu:
        diff("cuda-bf16-vs-fp32", "device=cuda,backend=torch,dtype=bf16", "device=cuda,backend=torch,dtype=fp32", None)
        diff("cpu-vs-cuda-fp32", "device=cuda,backend=torch,dtype=fp32", "device=cpu,dtype=fp32", None)
        diff(
            "cpu-vs-cuda-bf16",
            "device=cuda,backend=torch,dtype=bf16",
            "device=cpu,dtype=bf16",
            "device=cuda,backend=torch,dtype=fp32",
        )
        if fla:
            diff(
                "fla-vs-torch-bf16",
                "device=cuda,backend=torch,dtype=bf16",
                "device=cuda,backend=fla,dtype=bf16",
                "device=cuda,backend=torch,dtype=fp32",
            )
            diff(
                "fla-vs-torch-fp32", "device=cuda,backend=torch,dtype=fp32", "device=cuda,backend=fla,dtype=fp32", None
            )

    # hsstore env with and without the kernel packages importable
    sh(hs("env", "--model", "builtin:tiny-qwen3_5", "--json"), out / "env-default.json")
    sh(hs("env", "--model", "builtin:tiny-qwen3_5", "--backend", "torch", "--json"), out / "env-torch.json")

    refusal = "not run (needs the fla variant)"
    if gpu and fla:
        code = (
            "from hsstore import HiddenStateDataset, ProvenanceMismatch\n"
            f"train = HiddenStateDataset('{store}', variant='device=cuda,backend=torch,dtype=bf16')\n"
            "try:\n"
            f"    HiddenStateDataset('{store}', variant='device=cuda,backend=fla,dtype=bf16', require=train)\n"
            "    print('NOT REFUSED')\n"
            "except ProvenanceMismatch as e:\n"
            "    print(e)\n"
        )
        refusal = sh([sys.executable, "-c", code]).stdout.strip()

    write_report(out, builds, diffs, skipped, refusal, args, gpu, fla)
    print((out / "report.md").read_text())


def write_report(out: Path, builds: dict, diffs: list, skipped: list, refusal: str, args, gpu: bool, fla: bool) -> None:
    lines = [
        f"# Seed experiment ({args.size} model)",
        "",
        "## Variants",
        "",
        "| build | variant | backend | dtype | device | gated-delta | conv1d | attention | tokens | tokens/s (capture+write) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, b in builds.items():
        for v in b["variants"]:
            k = v["kernels"]
            tps = f"{v['tokens_per_second']:,.0f}" if v.get("tokens_per_second") else "-"
            lines.append(
                f"| {name} | `{v['variant']}` | {v['backend']} | {v['dtype']} | {v['device']} | "
                f"{k['chunk_gated_delta_rule']} | {k['causal_conv1d']} | {k['attention']} | {v['tokens']:,} | {tps} |"
            )
    for name, a, b, floor, rep in diffs:
        lines += [
            "",
            f"## diff {name}",
            "",
            f"A = `{a}`, B = `{b}`" + (f", floor C = `{floor}`" if floor else ""),
            f"shared samples {rep['shared_samples']}, tokens {rep['tokens']:,}",
            "",
            "| layer | rel-L2 A↔B | floor rel-L2 A↔C | ratio | cos mean | cos p01 | bit-exact | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for L in rep["layers"]:
            fr = f"{L['floor_rel_l2']:.3e}" if "floor_rel_l2" in L else "-"
            ratio = f"{L['floor_ratio']:.2f}" if "floor_ratio" in L else "-"
            lines.append(
                f"| {L['layer']} | {L['rel_l2']:.3e} | {fr} | {ratio} | {L['cos_mean']:.6f} | "
                f"{L['cos_p01']:.6f} | {L['bit_exact']:.4f} | {L.get('verdict', '')} |"
            )
        lines += ["", f"**verdict:** {rep['verdict']}", "", f"![{name}](diff-{name}.png)"]
    lines += ["", "## Provenance refusal", "", "```", refusal, "```", "", "## Skipped on this machine", ""]
    lines += [f"- {s}" for s in skipped] or ["- nothing"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Regeneration benchmark: hsstore's in-process engine against a plain batched ``model.generate`` loop over the
same prompts, and a whole regenerating build (generate, then capture) against generation alone — one run.

    python scripts/bench_generate.py --device cpu --dtype fp32 --model builtin:tiny-llama --prompts 32 --max-new-tokens 32
    python scripts/bench_generate.py --device cuda --dtype bf16 --model builtin:tiny-qwen3_5 --prompts 512 \
        --max-new-tokens 256 --token-budget 65536                                   # on a GPU
    python scripts/bench_generate.py --manifest manifests/gpu-8b-regen.toml --prompts 200   # a manifest's recipe

Measured in one process, on one model loaded once, greedy, prompts rendered from the bundled conversations
(cycled to ``--prompts``, a repeated row's first user turn numbered so that every prompt is distinct):
  plain     the prompts in the same token-budget batches, left-padded, through ``model.generate`` — the loop any
            regeneration script runs;
  hsstore   hsstore's regeneration (hsstore.capture.generate.regenerate): prompts rendered and tokenized, replies
            generated in batches, each batch checkpointed to a store — what ``hsstore build`` runs;
  build     ``hsstore build`` of the same prompts with ``[generate]`` (inline worker) into a fresh store: the
            generation (from the ledger's batch times) and the rest (loading, capture, writing). Its generation
            is ONE sample of the same batches through the same engine: it is reported against the spread
            (min, median, max) of the hsstore passes' generate times, never against their fastest alone (on
            two shared cores one batch varied 10x from pass to pass). An ``hsstore build`` in a fresh process
            also pays the process's first generation: set that against ``cold_plain_seconds``.
``--manifest M`` takes the model (path, config overrides, seed, init_device), the prompts (its first data file,
cycled), max_new_tokens, token budget, device and dtype from a build manifest, and the build captures its layers —
the same recipe ``hsstore build M`` runs (scripts/gpu_regen.sh). ``--repeat N`` runs plain and hsstore N times, alternating which goes first, after one untimed full plain pass
(the first generation in a process pays the allocator's and kernels' first use: its time is reported as
``cold_plain_seconds``), and keeps the fastest of each; ``--no-build`` leaves the build out. Prints generated tokens/s,
hsstore/plain, and the build's capture overhead against its generation, as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def data_lines(m: object | None) -> list[str]:
    """The rows the prompts come from: the manifest's first data file (JSON lines), or the bundled conversations."""
    path = Path(m.data_files[0]) if m is not None else REPO / "hsstore" / "data" / "conversations.jsonl"
    return [x for x in path.read_text().splitlines() if x.strip()]


def rows_of(lines: list[str], n: int) -> list[str]:
    """``n`` rows from ``lines``, cycled; a repeated row gets a numbered first user turn, so no two prompts are
    the same (hsstore generates a repeated prompt once and reuses the reply, plain would generate it again)."""
    out = []
    for i in range(n):
        row = json.loads(lines[i % len(lines)])
        if i >= len(lines):
            turns = row.get("messages") or row.get("conversations") or []
            user = next((t for t in turns if t.get("role", t.get("from")) in ("user", "human")), None)
            if user is not None:
                key = "content" if "content" in user else "value"
                user[key] = f"[{i}] {user[key]}"
            elif isinstance(row.get("prompt"), str):
                row["prompt"] = f"[{i}] {row['prompt']}"
        out.append(json.dumps(row, ensure_ascii=False))
    return out


def prompts_of(rows: list[str]) -> list:
    """One job (a row with its prompt) per row."""
    from hsstore.capture.generate.prompts import jobs_of

    return [jobs_of("bench", i + 1, json.loads(r), "auto", "last", 1)[0] for i, r in enumerate(rows)]


def plain(
    model: object, prompts: list[list[int]], batches: list[list[int]], pad: int, eos: list[int], new: int
) -> tuple[float, int]:
    """The plain loop: each batch left-padded through model.generate; generated tokens up to the first end."""
    import torch

    tokens, t0 = 0, time.perf_counter()
    for b in batches:
        width = max(len(prompts[i]) for i in b)
        ids = torch.full((len(b), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(b):
            ids[r, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[r, width - len(prompts[i]) :] = 1
        dev = next(model.parameters()).device
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                max_new_tokens=new,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for row in out[:, width:].tolist():
            ends = [j for j, t in enumerate(row) if t in eos]
            tokens += ends[0] + 1 if ends else len(row)
    return time.perf_counter() - t0, tokens


def hsstore_run(engine: object, jobs: list, masker: object, g: object, tmp: Path) -> tuple[float, int, list[float]]:
    """hsstore's regeneration of the jobs into a fresh store (checkpointed per batch), the model given: its wall
    time, generated tokens, and each batch's ``generate`` time (what a build's ledger records)."""
    import copy

    from hsstore.capture.generate.engines import end_ids
    from hsstore.capture.generate.regenerate import Run, regenerate_jobs
    from hsstore.storage.store import Store

    store = Store.create(str(tempfile.mkdtemp(dir=tmp, suffix=".zarr")))
    jobs = copy.deepcopy(jobs)
    run = Run(store, "bench", "0" * 32, g, "bench", {}, lambda: engine)
    t0 = time.perf_counter()
    regenerate_jobs(run, jobs, masker, 1 << 30, end_ids(masker.tok))
    seconds = time.perf_counter() - t0
    return seconds, sum(len(j.replies[-1].ids) for j in jobs), batch_seconds(r.to_dict() for r in run.cache.values())


def batch_seconds(replies: object) -> list[float]:
    """Each batch's generate time, from replies or ledger records (one wall time per batch, shared by its replies)."""
    return sorted({r["seconds"] for r in replies}, reverse=True)


def spread(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {
        "min": xs[0],
        "median": xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2,
        "max": xs[-1],
    }


def build_run(args: argparse.Namespace, man: object | None, rows: list[str], tmp: Path) -> dict:
    """``hsstore build`` with [generate] of the same prompts (the manifest's recipe, if given): total time and
    the generation's part (one sample, with a model drawn afresh: set it against the spread of the hsstore
    passes, not their fastest)."""
    from hsstore.capture.inputs.manifest_file import load_manifest
    from hsstore.capture.run.driver import build

    data = tmp / "rows.jsonl"
    data.write_text("\n".join(rows) + "\n")
    m = tmp / "m.toml"
    m.write_text(
        f'[model]\npath = "{args.model}"\nlayers = {{ aux = [0], target = [1] }}\n[data]\nfiles = ["{data}"]\n'
        f"max_length = 4096\n[generate]\nmax_new_tokens = {args.max_new_tokens}\n[build]\n"
        f'dtypes = ["{args.dtype}"]\ndevices = ["{args.device}"]\ntoken_budget = {args.token_budget}\n'
        f'[store]\npath = "{tmp / "build.zarr"}"\n'
    )
    recipe = load_manifest(m)
    if man is not None:  # the manifest's model, layers and [generate], on these prompts, device and dtype
        recipe = man.replace(
            data_files=[str(data)],
            store_path=recipe.store_path,
            devices=recipe.devices,
            dtypes=recipe.dtypes,
            backends=["torch"],
        )
    t0 = time.perf_counter()
    s = build(recipe, quiet=True, inline=True)
    total = time.perf_counter() - t0
    ledger = [
        json.loads(x) for x in (tmp / "build.zarr" / "builds" / s.build_id / "ledger.jsonl").read_text().splitlines()
    ]
    batches = batch_seconds(ledger)
    gen = sum(batches)
    return {
        "seconds": total,
        "generation_seconds": gen,
        "generation_batch_seconds": batches,
        "capture_and_rest_seconds": total - gen,
        "overhead_vs_generation": (total - gen) / gen,
        "samples": s.variants[0].samples_written,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--device", default=None, help="default: the manifest's first device, else cpu")
    ap.add_argument("--dtype", default=None, help="default: the manifest's first dtype, else fp32")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the manifest's, else 32")
    ap.add_argument("--token-budget", type=int, default=None, help="default: the manifest's, else 16384")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-build", action="store_true", help="measure generation only (no hsstore build)")
    ap.add_argument(
        "--manifest",
        default=None,
        help="a build manifest with [generate]: its model, prompts and layers "
        "(and its max_new_tokens, token budget, device and dtype, unless given)",
    )
    args = ap.parse_args()
    man = None
    if args.manifest:
        from hsstore.capture.inputs.manifest_file import load_manifest

        man = load_manifest(args.manifest)
        args.model = man.model_path
    given = {
        "device": (man.devices[0] if man else "cpu"),
        "dtype": (man.dtypes[0] if man else "fp32"),
        "max_new_tokens": (man.generate.max_new_tokens if man and man.generate else 32),
        "token_budget": (man.token_budget if man else 16384),
    }
    for key, default in given.items():
        if getattr(args, key) is None:
            setattr(args, key, default)

    from hsstore.capture.generate.engines import LocalEngine, end_ids, prompt_batches
    from hsstore.capture.generate.prompts import prompt_tokens
    from hsstore.capture.inputs.lossmask import ChatMasker
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.core.dtypes import TORCH
    from hsstore.core.schema.manifest import GenerateTable

    spec = (
        ModelSpec(man.model_path, man.config_overrides, man.seed, init_device=man.init_device)
        if man
        else ModelSpec(args.model)
    )
    tok = spec.tokenizer()
    model = spec.load(TORCH[args.dtype], args.device, "sdpa")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    masker = ChatMasker(tok)
    rows = rows_of(data_lines(man), args.prompts)
    jobs = prompts_of(rows)
    prompts = [prompt_tokens(masker, j, 1 << 30) for j in jobs]
    g = GenerateTable(max_new_tokens=args.max_new_tokens)
    engine = LocalEngine(model, tok, pad, args.token_budget)
    batches = prompt_batches([len(p) for p in prompts], args.max_new_tokens, args.token_budget)
    t0 = time.perf_counter()  # warm-up: one whole untimed pass (kernels, allocator, every batch shape)
    plain(model, prompts, batches, pad, end_ids(tok), args.max_new_tokens)
    cold = time.perf_counter() - t0
    print(f"cold plain pass: {cold:.1f} s", file=sys.stderr, flush=True)
    runs: dict[str, list] = {"plain": [], "hsstore": []}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(args.repeat):  # alternate which goes first, so neither always follows the other
            for name in ("plain", "hsstore") if rep % 2 == 0 else ("hsstore", "plain"):
                runs[name].append(
                    plain(model, prompts, batches, pad, end_ids(tok), args.max_new_tokens)
                    if name == "plain"
                    else hsstore_run(engine, jobs, masker, g, Path(d))
                )
                print(f"{name}: {runs[name][-1]}", file=sys.stderr, flush=True)
        del model, engine
        built = None if args.no_build else build_run(args, man, rows, Path(d))
        print(f"build: {built}", file=sys.stderr, flush=True)
    if built is not None:  # one sample against every hsstore pass's generate time (the same batches)
        passes = [sum(r[2]) for r in runs["hsstore"]]
        built["hsstore_generation_seconds"] = spread(passes)
        built["generation_vs_hsstore"] = {k: built["generation_seconds"] / v for k, v in spread(passes).items()}
    best = {k: min(v) for k, v in runs.items()}
    out = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "batches": len(batches),
        "cold_plain_seconds": cold,
        **{f"{k}_tokens_per_s": v[1] / v[0] for k, v in best.items()},
        **{f"{k}_generated_tokens": v[1] for k, v in best.items()},
        "hsstore_vs_plain": (best["hsstore"][1] / best["hsstore"][0]) / (best["plain"][1] / best["plain"][0]),
        "build": built,
        "runs": runs,
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

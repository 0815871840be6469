"""Diff benchmark: the ``hsstore diff`` process, its start-up taken out, against reading the same two
variants in a warm process; in one run, read and diff runs interleaved.

    python scripts/bench_diff.py --hidden 512 2048 5120 --reps 3            # synthetic stores, both pairs
    python scripts/bench_diff.py --store out/s.zarr --pair 'dtype=bf16|dtype=fp32' --reps 3   # a built store
    python scripts/bench_diff.py --hidden 512 2048 --reps 5 --baseline DIR   # and another tree's diff, same reps

Without ``--store`` it writes, per hidden size, a store of three variants of synthetic residual-stream-like
states (``--layers`` layers, the default codec, a build's chunking): fp32 B, bf16 A = B plus small noise,
and a second bf16 variant C = B rounded (backend ``ref``); about ``--mb`` MB of states per variant
pair. Pairs: A vs B (bf16 vs fp32) and A vs C (bf16 vs bf16, ULP buckets too). Per pair and rep, in this
order: read = every sample of both variants through ``HiddenStateDataset`` (all layers, 0 workers: what a
training loop reads) in this warm process; diff = ``python -m hsstore diff A B --json FILE`` as a user
runs it; start-up = a fresh process importing torch, the CLI and the read and diff modules and ending as the
CLI ends (the fixed cost any ``hsstore diff`` pays besides its work); arithmetic = the statistics' own work
(``token_sums`` + ``summarize``, on the compiled loops or torch's ops as the diff chooses) on states
already in memory, on the diff's threads. Reported: medians, the ratio read / (diff - start-up) (>= 0.8:
the diff, past its start-up, streams at 80% of the read rate or better) and its bound read / (read +
arithmetic): reading and arithmetic share the cores, so a diff cannot beat it; and the ceiling read / (read +
one pass), one pass = a ``torch.sum`` of every state of both variants in memory on the same threads: what any
statistics of every value would leave at best, their arithmetic at memory speed. Also reported: the diff's
own work, the ``seconds`` of its JSON report (opening both variants, reading, arithmetic, verdict, and
loading the compiled loops where the diff takes them; no interpreter start-up or imports), and read / work: the difference of two processes' wall times is noisy where
start-up is seconds and the work is a fraction of it. And the warm diff: ``run_diff`` again in this process
(compiled loops loaded, imports and allocator warm), read / warm diff: the rate a diff many times larger
approaches once its fixed costs are paid.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hsstore import HiddenStateDataset, Store
from hsstore.core.keys import SampleTokens, sample_key
from hsstore.storage.codecs import DEFAULT, chunk_tokens
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import provenance

# (ended as the CLI ends: without the interpreter's teardown, hsstore.core.interrupt.end_process)
STARTUP = (
    "import torch, hsstore.cli.main, hsstore.cli.compare_cmd, hsstore.compare.diff, hsstore.read.dataset\n"
    "from hsstore.core.interrupt import end_process; end_process(0)"
)


VARIANTS = (("bf16", "torch", 2), ("fp32", "torch", 4), ("bf16", "ref", 2))  # A, B, C (= B rounded)
PAIRS = (("backend=torch,dtype=bf16", "dtype=fp32"), ("backend=torch,dtype=bf16", "backend=ref"))


def _provenance(dtype: str, backend: str, layers: list[int]) -> dict:
    return provenance(dtype, backend, tok="bench", layers={"aux": layers[:-1], "target": layers[-1:]}, model="bench")


def make_store(path: Path, n: int, hidden: int, n_layers: int, mean_len: int, codec: str, seed: int = 0) -> str:
    """Three variants (bf16 A, fp32 B, bf16 C = B rounded) of ``n`` samples; returns the store path."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    store = Store.create(path)
    layers, roles = list(range(n_layers)), {"aux": list(range(n_layers - 1)), "target": [n_layers - 1]}
    writers = [
        UnitWriter(
            store,
            store.create_variant(_provenance(dt, be, layers), roles, hidden, dt, codec, chunk_tokens(hidden, size)),
        )
        for dt, be, size in VARIANTS
    ]
    scale = torch.exp(torch.randn(hidden, generator=g))  # per-channel scales, like a residual stream
    for start in range(0, n, 8):
        samples = []
        for _ in range(min(8, n - start)):
            t = int(rng.integers(mean_len // 2, mean_len * 3 // 2))
            ids = rng.integers(0, 150000, t).astype(np.int32)
            mask = np.ones(t, np.uint8)
            samples.append(SampleTokens(sample_key("bench", ids, mask), ids, mask))
        total = sum(s.length for s in samples)
        ref = {i: torch.randn(total, hidden, generator=g) * scale * (1 + i) for i in layers}
        noisy = {
            i: (x + 2e-3 * (1 + i) * torch.randn(total, hidden, generator=g) * scale).bfloat16() for i, x in ref.items()
        }
        for w, states in zip(writers, (noisy, ref, {i: x.bfloat16() for i, x in ref.items()})):
            w.write(samples, states)
    return str(path)


def read_both(store: str, a: str, b: str) -> int:
    """Read every sample of both variants through the dataset class; returns logical state bytes."""
    total = 0
    for sel in (a, b):
        ds = HiddenStateDataset(store, variant=sel)
        for i in range(len(ds)):
            item = ds[i]
            total += item["aux_hidden"].nbytes + item["target_hidden"].nbytes
    return total


def arithmetic(store: str, a: str, b: str, threads: int | None) -> tuple[float, float]:
    """Seconds of the diff's own arithmetic (``kernel.token_sums`` + ``kernel.summarize``, what the
    statistics need) on states already in memory, on the diff's threads: the part of a diff that reading
    cannot hide, since both run on the same cores; and seconds of one minimal pass over the same values
    (a ``torch.sum`` of every layer of both variants, same threads): what any statistics cost at least."""
    from concurrent.futures import ThreadPoolExecutor

    from hsstore.compare.diff import (
        ThreadLocal,
        both_bf16,
        cpu_threads,
        open_target,
        shared_keys,
        torch_single_threaded,
        use_compiled,
    )
    from hsstore.compare.kernel import Workspace, summarize, token_sums

    ra, rb = open_target(f"{store}#{a}"), open_target(f"{store}#{b}")
    layers, ulps, hidden = ra.record.all_layers, both_bf16(ra, rb), ra.record.hidden_size
    states = [(k, ra.read_layers(ra.refs[k], layers), rb.read_layers(rb.refs[k], layers)) for k in shared_keys(ra, rb)]
    compiled = use_compiled(ra, [k for k, _, _ in states], layers, [ulps])  # the diff's own choice
    workspaces = ThreadLocal(lambda: Workspace("cpu", compiled))

    def one(item: tuple) -> None:  # type: ignore[type-arg]
        ws = workspaces.get()
        summarize(item[0], token_sums(item[1], item[2], ws, ulps), hidden, ws)

    def one_pass(item: tuple) -> None:  # type: ignore[type-arg]
        for x in (*item[1], *item[2]):
            torch.sum(x)

    with torch_single_threaded(), ThreadPoolExecutor(threads or cpu_threads()) as pool:
        list(pool.map(one, states[:2]))  # (compiled kernels loaded, buffers made)
        return _timed(lambda: list(pool.map(one, states))), _timed(lambda: list(pool.map(one_pass, states)))


def warm_diff(store: str, a: str, b: str, threads: int | None) -> float:
    """Seconds of ``run_diff`` in this process, which has run it before (imports, compiled loops and the allocator
    warm): the diff's cost per byte once its fixed costs are paid, which a diff many times larger approaches."""
    from hsstore.compare.diff import DiffRequest, run_diff

    request = DiffRequest(a_target=f"{store}#{a}", b_target=f"{store}#{b}", threads=threads)
    run_diff(request)
    return _timed(lambda: run_diff(request))


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _process(*args: str, tree: str | None = None) -> None:
    """``python ARGS`` with ``tree``'s ``hsstore/`` (default: this checkout's) first on the path, run from ``/``:
    ``-m`` and ``-c`` put the working folder ahead of PYTHONPATH, which ran this checkout as the baseline."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [tree or str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd="/")
    if r.returncode not in (0, 1):  # (diff exits 1 only for --max-rel, which is not passed)
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")


def bench_pair(store: str, a: str, b: str, reps: int, threads: int | None, baseline: str | None = None) -> dict:
    """Interleaved per rep: read both (warm, in this process), the diff process, a start-up process; with a
    ``baseline`` tree, its diff process too, the two diffs' order alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "d.json")
        diff = ["-m", "hsstore", "diff", f"{store}#{a}", f"{store}#{b}", "--json", out]
        diff += ["--threads", str(threads)] if threads else []
        nbytes = read_both(store, a, b)  # warm-up: page cache, and the compiled loops' disk cache
        _process(*diff)
        if baseline:
            _process(*diff, tree=baseline)
        reads, diffs, starts, ariths, passes, works, base_works, warms = [], [], [], [], [], [], [], []
        for rep in range(reps):
            reads.append(_timed(lambda: read_both(store, a, b)))
            for tree in (None, baseline) if rep % 2 == 0 else (baseline, None):
                if tree is None:
                    diffs.append(_timed(lambda: _process(*diff)))
                    report = json.loads(Path(out).read_text())
                    works.append(report["seconds"])  # the diff's own clock: open to verdict
                elif baseline:
                    _process(*diff, tree=baseline)
                    base_works.append(json.loads(Path(out).read_text())["seconds"])
            starts.append(_timed(lambda: _process("-c", STARTUP)))
            arith, one_pass = arithmetic(store, a, b, threads)
            ariths.append(arith)
            passes.append(one_pass)
            warms.append(warm_diff(store, a, b, threads))
    r, d, s, ar, w, p = (statistics.median(x) for x in (reads, diffs, starts, ariths, works, passes))
    row = {
        "store": store,
        "a": a,
        "b": b,
        "state_bytes": nbytes,
        "tokens": report["tokens"],
        "read_s": reads,
        "diff_s": diffs,
        "startup_s": starts,
        "arith_s": ariths,
        "work_s": works,
        "read": r,
        "diff": d,
        "work": w,
        "work_ratio": r / max(w, 1e-9),
        "startup": s,
        "arith": ar,
        "diff_net": d - s,
        "ratio": r / max(d - s, 1e-9),
        "bound": r / (r + ar),
        "pass_s": passes,
        "pass": p,
        "ceiling": r / (r + p),
        "verdict": report["verdict_kind"],
        "warm_s": warms,
        "warm": statistics.median(warms),
        "warm_ratio": r / statistics.median(warms),
    }
    if base_works:
        bw = statistics.median(base_works)
        row.update(baseline_work_s=base_works, baseline_work=bw, baseline_work_ratio=r / max(bw, 1e-9))
    return row


def _stores(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]]]]:
    if args.store:
        pairs = [tuple(p.split("|", 1)) for p in args.pair] or [("dtype=bf16", "dtype=fp32")]
        return [(args.store, pairs)]  # type: ignore[list-item]
    out = []
    for h in args.hidden:
        tokens = max(64, int(args.mb * 1e6 / (h * args.layers * 6)))  # ~mb MB of A + B states
        n = max(8, tokens // args.mean_len)
        path = Path(args.dir) / f"h{h}-l{args.layers}-n{n}-t{args.mean_len}-{args.codec}.zarr"
        if not path.exists():
            t0 = time.perf_counter()
            make_store(path, n, h, args.layers, args.mean_len, args.codec)
            print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        out.append((str(path), list(PAIRS)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/hsstore-bench-diff")
    ap.add_argument("--store", help="an existing (built) store instead of synthetic ones")
    ap.add_argument("--pair", action="append", default=[], help="with --store: 'SEL_A|SEL_B' (repeatable)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 2048, 5120])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mb", type=float, default=600, help="MB of A + B states per synthetic store")
    ap.add_argument("--mean-len", type=int, default=512)
    ap.add_argument("--codec", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="diff --threads (default: every core)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--baseline",
        help="a folder holding another tree's hsstore/ (git archive REV hsstore | tar -x -C "
        "DIR): its diff's own work is measured in the same reps",
    )
    args = ap.parse_args()
    rows = []
    for store, pairs in _stores(args):
        for a, b in pairs:
            row = bench_pair(store, a, b, args.reps, args.threads, args.baseline)
            rows.append(row)
            print(
                f"{Path(store).name} {a} vs {b}: {row['state_bytes'] / 1e9:.2f} GB, {row['tokens']:,} tokens; "
                f"read {row['read']:.2f} s, diff {row['diff']:.2f} s - start-up {row['startup']:.2f} s = "
                f"{row['diff_net']:.2f} s; read/diff {row['ratio']:.2f}; the diff's own work (its report's seconds) "
                f"{row['work']:.2f} s, read/work {row['work_ratio']:.2f}; arithmetic {row['arith']:.2f} s, "
                f"bound read/(read + arithmetic) {row['bound']:.2f}; one pass {row['pass']:.3f} s, ceiling read/(read "
                f"+ one pass) {row['ceiling']:.2f}; warm diff (in this process, fixed costs paid) {row['warm']:.2f} s, "
                f"read/warm diff {row['warm_ratio']:.2f}  (reads {_fmt(row['read_s'])}; diffs "
                f"{_fmt(row['diff_s'])}; start-ups {_fmt(row['startup_s'])}; arithmetic {_fmt(row['arith_s'])})",
                flush=True,
            )
            if "baseline_work" in row:
                print(
                    f"  baseline {args.baseline}: work {row['baseline_work']:.2f} s, read/work "
                    f"{row['baseline_work_ratio']:.2f}  (works {_fmt(row['baseline_work_s'])}; this tree "
                    f"{_fmt(row['work_s'])})",
                    flush=True,
                )
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def _fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    main()

"""Where a diff's time goes beyond its arithmetic, in one warm process: reading both variants on the diff's own
threads (``hsstore.compare.diff.map_samples`` with a no-op reduce) with readers opened fresh and with readers
already open, on 1 and 2 threads; what opening one unit's array costs; and the diff's streaming pass and a whole
``run_diff`` with everything loaded.

    python scripts/bench_diff.py --hidden 512 --mb 4000 --reps 1      # writes the store it reads (or any store)
    python scripts/probe_diff_read.py --store /tmp/hsstore-bench-diff/h512-l4-n635-t512-shuffle-zstd.zarr

``--pair 'SEL_A|SEL_B'`` picks the two variants (default: bench_diff's bf16 vs fp32 pair). Medians of ``--reps``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from hsstore.compare.diff import DiffRequest, map_samples, open_target, run_diff, shared_keys, stream_pass
from hsstore.compare.kernel import compiled_kernel
from hsstore.storage import layout


def _median(reps: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--pair", default="backend=torch,dtype=bf16|dtype=fp32")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sel_a, sel_b = args.pair.split("|")
    a_t, b_t = f"{args.store}#{sel_a}", f"{args.store}#{sel_b}"

    def read_pass(threads: int, fresh: bool) -> float:
        a, b = open_target(a_t), open_target(b_t)
        keys, layers = shared_keys(a, b), a.record.all_layers
        if not fresh:  # every array opened by a first pass
            sum(1 for _ in map_samples([a, b], keys, layers, lambda k, s: 0, threads=threads))
        t0 = time.perf_counter()
        sum(1 for _ in map_samples([a, b], keys, layers, lambda k, s: 0, threads=threads))
        return time.perf_counter() - t0

    for threads in (1, 2):
        fresh, opened = (_median(args.reps, lambda f=f: read_pass(threads, f)) for f in (True, False))
        print(f"read both on {threads} thread(s): fresh readers {fresh:.2f} s, readers already open {opened:.2f} s")

    def open_arrays() -> float:
        r = open_target(b_t)
        units = sorted({ref.unit for ref in r.refs.values()})
        names = [*layout.TOKEN_ARRAYS, *(layout.layer_array(i) for i in r.record.all_layers)]
        t0 = time.perf_counter()
        for u in units:
            for n in names:
                r.shard(u, n)
        return (time.perf_counter() - t0) / (len(units) * len(names))

    per = _median(args.reps, open_arrays)
    arrays = len({ref.unit for ref in open_target(b_t).refs.values()}) * (
        len(layout.TOKEN_ARRAYS) + len(open_target(b_t).record.all_layers)
    )
    print(f"opening one unit's array: {per * 1e3:.3f} ms ({arrays} arrays in variant {sel_b})")

    request = DiffRequest(a_target=a_t, b_target=b_t)
    compiled_kernel()
    run_diff(request)  # the C loops built (the first time on this host) and loaded

    def pass_open() -> float:
        a, b = open_target(a_t), open_target(b_t)
        keys, layers = shared_keys(a, b), a.record.all_layers
        stream_pass(a, [b], keys, layers, request, False)
        t0 = time.perf_counter()
        stream_pass(a, [b], keys, layers, request, False)
        return time.perf_counter() - t0

    def whole() -> float:
        t0 = time.perf_counter()
        run_diff(request)
        return time.perf_counter() - t0

    print(
        f"streaming pass (read + arithmetic), readers already open: {_median(args.reps, pass_open):.2f} s; "
        f"run_diff, warm: {_median(args.reps, whole):.2f} s"
    )


if __name__ == "__main__":
    main()

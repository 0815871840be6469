"""Reading from an object store: hsstore's ranged reads (one GET per sample and layer) against zarr-python
reading the same arrays (how hsstore read remote stores before 2026-12-01), in one run, on an S3 server
on loopback (moto; needs the test extras).

    python scripts/bench_remote_read.py --samples 64 --tokens 512 --hidden 2048 --reps 3

A variant of 3 bf16 layers with the build's chunking (~1 MiB chunks) is written to s3:// once; each rep
reads every sample's layers in key order through both paths, alternating which goes first. Prints
median seconds and MB/s of state bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import zarr

from hsstore.testing.bench import moto_s3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with moto_s3("bench") as bucket:
        run(args, bucket)


def run(args: argparse.Namespace, bucket: str) -> None:
    from hsstore import Store
    from hsstore.storage import layout
    from hsstore.storage.codecs import chunk_tokens
    from hsstore.testing.factories import new_variant, write_unit  # layers 0, 1 (aux) and 2 (target)

    url = f"{bucket}/{uuid.uuid4().hex[:8]}/s.zarr"
    store = Store.create(url)
    vid = new_variant(store, hidden=args.hidden, codec="shuffle-zstd", chunk=chunk_tokens(args.hidden, 2))
    write_unit(store, vid, [args.tokens] * args.samples, writer_id="w")
    reader = Store.open(url).reader(vid)
    refs = [reader.refs[k] for k in reader.keys]
    unit = f"{url}/{layout.unit_prefix(vid, refs[0].unit)}"

    def hsstore_reads() -> None:
        for ref in refs:
            reader.read_layers(ref, [0, 1, 2])

    arrays = {i: zarr.open_array(f"{unit}/{layout.layer_array(i)}", mode="r") for i in (0, 1, 2)}

    def zarr_reads() -> None:
        for ref in refs:
            for a in arrays.values():
                a[ref.offset : ref.offset + ref.length]

    hsstore_reads(), zarr_reads()  # open everything once
    times: dict[str, list[float]] = {"hsstore ranged reads": [], "zarr-python": []}
    for rep in range(args.reps):
        order = list(times.items()) if rep % 2 == 0 else list(times.items())[::-1]
        for name, ts in order:
            t0 = time.perf_counter()
            (hsstore_reads if name.startswith("hsstore") else zarr_reads)()
            ts.append(time.perf_counter() - t0)
    mb = args.samples * args.tokens * args.hidden * 2 * 3 / 1e6
    print(
        f"{args.samples} samples x {args.tokens} tokens x 3 layers x {args.hidden} bf16 ({mb:.0f} MB), "
        f"chunks of {chunk_tokens(args.hidden, 2)} tokens, moto S3 on loopback; medians of {args.reps}"
    )
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:>22}: {m:.2f} s, {mb / m:.0f} MB/s")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Issue 41 on the GPU machine (16 cores): the diff kernel's CUDA test, then scripts/bench_diff.py on its CPUs
# against a baseline tree, then one bf16-vs-bf16 `hsstore diff --device cuda` checked against the CPU diff.
# Prepare here: bash scripts/prepare_gpu_wheels.sh regen; git archive REV hsstore | tar -x -C .basetree
# (echo /.basetree/ >> .git/info/exclude); run there with carry [".whl", ".basetree"]:
#   bash scripts/gpu_diff.sh       (results under $OUT, or ./gpu-diff-out)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-diff-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
{ nproc; uptime; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, numba, zarr; print(torch.__version__, numba.__version__, zarr.__version__)"; } 2>&1 | tee "$out/machine.txt"
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/compare/test_kernel.py 2>&1 | tail -4 | tee "$out/kernel-tests.txt"
python3 scripts/bench_diff.py --hidden 512 2048 5120 --mb 300 --reps 3 --baseline "$PWD/.basetree" \
  --json "$out/diff-16core.json" 2>&1 | tee "$out/bench-diff.txt"
store=$(ls -d /tmp/hsstore-bench-diff/h2048-*.zarr | head -1)
for dev in cpu cuda; do
  python3 -m hsstore diff "$store#backend=torch,dtype=bf16" "$store#backend=ref" --device $dev --json "$out/diff-$dev.json" \
    > "$out/diff-$dev.txt" 2>&1
done
python3 - "$out" <<'PY' 2>&1 | tee "$out/cuda-vs-cpu.txt"
import json, sys
c, g = (json.load(open(f"{sys.argv[1]}/diff-{d}.json")) for d in ("cpu", "cuda"))
print("verdict cpu:", c["verdict_kind"], "cuda:", g["verdict_kind"], "seconds cpu/cuda:", c["seconds"], g["seconds"])
for lc, lg in zip(c["layers"], g["layers"]):
    print(lc["layer"], "ulp_distribution equal:", lc.get("ulp_distribution") == lg.get("ulp_distribution"), lc.get("ulp_distribution"), "max_abs", lc["max_abs"], lg["max_abs"], "rel_l2", lc["rel_l2"], lg["rel_l2"])
PY

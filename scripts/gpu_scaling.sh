#!/usr/bin/env bash
# The 2-GPU runs behind docs/benchmarks.md "Scale-out" (an nvidia-h200-x2 machine with no network;
# wheels it lacks are carried in .whl/, made by scripts/prepare_gpu_wheels.sh).
#   bash scripts/gpu_scaling.sh ranks   # 27B-shaped model: 1 rank vs torchrun 2 ranks, one GPU each
#   bash scripts/gpu_scaling.sh split   # tests/scenarios/test_gpu.py, then a 1.6B model on 1 GPU vs spread over 2
#   bash scripts/gpu_scaling.sh aba     # both again with the baseline repeated last (run-order effects)
#   bash scripts/gpu_scaling.sh long    # 1x1, 2x1, 1x1 over ~0.9 M tokens (amortizes the fixed per-rank cost)
set -u
OUT=${OUT:-out/gpu-scaling}
mkdir -p "$OUT"
[ -d /tmp/site/zarr ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; nproc; df -h /tmp;
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|accelerate|fla-core|flash-linear|zarr|numcodecs|triton) ";
  dd if=/dev/zero of=/tmp/dd.bin bs=16M count=256 conv=fsync 2>&1 | tail -1; rm -f /tmp/dd.bin; } > "$OUT/machine-$1.txt" 2>&1
if [ "$1" = ranks ]; then
  python3 scripts/bench_scaling.py --configs 1x1,2x1 --shape 27b --rows 320 --out "$OUT/ranks" --store-dir /tmp/scal \
    > "$OUT/ranks.txt" 2>&1
  echo "exit $?" >> "$OUT/ranks.txt"
elif [ "$1" = long ]; then
  timeout 90 python3 -m pytest -q -p no:xdist tests/capture/test_pipeline.py > "$OUT/test_pipeline.txt" 2>&1
  echo "exit $?" >> "$OUT/test_pipeline.txt"
  timeout $((585 - SECONDS)) python3 scripts/bench_scaling.py --configs 1x1,2x1,1x1 --shape 27b --rows 600 --no-diff \
    --out "$OUT/ranks-long" --store-dir /tmp/scal > "$OUT/ranks-long.txt" 2>&1
  echo "exit $?" >> "$OUT/ranks-long.txt"
elif [ "$1" = aba ]; then
  python3 scripts/bench_scaling.py --configs 1x1,2x1,1x1 --shape 27b --rows 256 --no-diff --out "$OUT/ranks-aba" \
    --store-dir /tmp/scal > "$OUT/ranks-aba.txt" 2>&1
  echo "exit $?" >> "$OUT/ranks-aba.txt"
  python3 scripts/bench_scaling.py --configs 1x1,1x2,1x1 --shape 1.6b --init cpu --rows 96 --out "$OUT/split-aba" \
    --store-dir /tmp/split > "$OUT/split-aba.txt" 2>&1
  echo "exit $?" >> "$OUT/split-aba.txt"
  timeout $((570 - SECONDS)) python3 -m pytest -q -ra tests/scenarios/test_gpu.py > "$OUT/test_gpu.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/test_gpu.txt"
else
  timeout 240 python3 -m pytest -q -ra tests/scenarios/test_gpu.py > "$OUT/test_gpu.txt" 2>&1
  echo "exit $?" >> "$OUT/test_gpu.txt"
  python3 scripts/bench_scaling.py --configs 1x1,1x2 --shape 1.6b --init cpu --rows 192 --out "$OUT/split" \
    --store-dir /tmp/split > "$OUT/split.txt" 2>&1
  echo "exit $?" >> "$OUT/split.txt"
fi

#!/usr/bin/env bash
# The H200 runs behind docs/benchmarks.md "FP8 storage" and docs/notes/gpu-report.md "FP8 storage on the seed
# model" (one nvidia-h200, no network; .whl/ made by scripts/prepare_gpu_wheels.sh and carried). Two
# phases, each well inside one 10-minute call; results as JSON/text under $OUT:
#   bash scripts/gpu_fp8.sh build   # ~5 min: 27B-shaped build vs bare forward (bf16 default codec, FP8),
#                                   #   passes alternating, repeated; FP8 size and error; kernel shapes on a
#                                   #   fresh triton cache with and without bucketed padding
#   bash scripts/gpu_fp8.sh seed    # ~5 min: the 1.6 B seed model: torch bf16/fp32, fla bf16 and fla FP8
#                                   #   builds, convert, diffs with verdicts, info, GPU vs CPU quantization
#                                   #   bit-identity, bf16-vs-FP8 training, FP8 reads on 16 cores
#   bash scripts/gpu_fp8.sh build4  # ~9 min: bare, bf16 default codec and FP8 builds, 4 alternating rounds
#                                   #   (the first round of a fresh disk apart), then FP8 reads on 16 cores
#   bash scripts/gpu_fp8.sh train   # ~6 min: the seed model's torch bf16 variant and its FP8 conversion:
#                                   #   bf16-vs-FP8 drafter training, same seed (loss curves)
#   bash scripts/gpu_fp8.sh read    # ~4 min: FP8 and bf16 reads on 16 cores: DataLoader with 0 and 8 workers,
#                                   #   and the streaming dataset reading 8 samples ahead on threads
#   bash scripts/gpu_fp8.sh sampled # ~4 min: 1,000 rows of the seed model, fla vs torch: full diff against
#                                   #   1 % sampled diffs with five seeds (verdicts, interval coverage)
set -u
OUT=${OUT:-out/gpu-fp8}
mkdir -p "$OUT"
[ -d /tmp/site/zarr ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; df -h /tmp;
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|fla-core|flash-linear|zarr|numcodecs|triton) ";
  git log --oneline -1; } > "$OUT/machine-$1.txt" 2>&1
if [ "$1" = build ]; then
  # 76 rows x 2048 = 155,648 tokens; bare, bf16 shuffle-zstd, fp8 shuffle-zstd, fp8 none; twice, alternating
  timeout 330 python3 scripts/bench_build.py --shape 27b --device cuda --rows 76 --length 2048 \
    --codecs shuffle-zstd,fp8:shuffle-zstd,fp8:none --repeat 2 --store-dir /tmp/bench \
    --json "$OUT/bench-27b-fp8.json" > "$OUT/bench-27b-fp8.txt" 2>&1
  echo "exit $?" >> "$OUT/bench-27b-fp8.txt"
  timeout $((570 - SECONDS)) python3 scripts/bench_shapes.py --rows 96 --json "$OUT/shapes.json" \
    > "$OUT/shapes.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/shapes.txt"
elif [ "$1" = build4 ]; then
  timeout 380 python3 scripts/bench_build.py --shape 27b --device cuda --rows 76 --length 2048 \
    --codecs shuffle-zstd,fp8:shuffle-zstd --repeat 4 --store-dir /tmp/bench \
    --json "$OUT/bench-27b-repeat4.json" > "$OUT/bench-27b-repeat4.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/bench-27b-repeat4.txt"
  rm -rf /tmp/bench
  (cd scripts && timeout $((585 - SECONDS)) python3 bench_fp8_read.py --dir /tmp/fp8read --samples 24 --hidden 5120 \
    --reps 2 --workers 0,8 --json "$OUT/read-fp8-16cores.json" > "$OUT/read-fp8-16cores.txt" 2>&1)
  echo "exit $? after ${SECONDS}s" >> "$OUT/read-fp8-16cores.txt"
elif [ "$1" = read ]; then
  (cd scripts && timeout 560 python3 bench_fp8_read.py --dir /tmp/fp8read --samples 48 --hidden 5120 \
    --reps 2 --workers 0,8 --prefetch 8 --json "$OUT/read-fp8-16cores-prefetch.json" > "$OUT/read-fp8-16cores-prefetch.txt" 2>&1)
  echo "exit $? after ${SECONDS}s" >> "$OUT/read-fp8-16cores-prefetch.txt"
elif [ "$1" = train ]; then
  timeout 560 python3 scripts/gpu_fp8_seed.py --out /tmp/seedt --rows 40 --steps 200 --train-only > "$OUT/train.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/train.txt"
  cp /tmp/seedt/summary.json "$OUT/train-summary.json" 2>/dev/null
  cp /tmp/seedt/train-*.json "$OUT/" 2>/dev/null
elif [ "$1" = seed ]; then
  timeout 420 python3 scripts/gpu_fp8_seed.py --out /tmp/seed8 --rows 40 > "$OUT/seed.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/seed.txt"
  cp /tmp/seed8/summary.json "$OUT/seed-fp8-summary.json" 2>/dev/null
  tar czf "$OUT/seed-fp8.tgz" -C /tmp/seed8 --exclude '*.zarr' . 2>/dev/null
  (cd scripts && timeout $((585 - SECONDS)) python3 bench_fp8_read.py --dir /tmp/fp8read --samples 48 --hidden 5120 \
    --reps 3 --workers 0,4,8 --json "$OUT/read-fp8-16cores.json" > "$OUT/read-fp8-16cores.txt" 2>&1)
  echo "exit $? after ${SECONDS}s" >> "$OUT/read-fp8-16cores.txt"
elif [ "$1" = quant ]; then
  # GPU-quantized codes against the same states quantized on the CPU, and hsstore check on the FP8 variant
  timeout 240 python3 scripts/gpu_fp8_seed.py --out /tmp/seedq --rows 24 --quant-only > "$OUT/quant.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/quant.txt"
  cp /tmp/seedq/summary.json "$OUT/quant-summary.json" 2>/dev/null
elif [ "$1" = sampled ]; then
  # issue 20: a 1 % sampled diff against the full diff on the seed model's fla-vs-torch stores
  timeout 400 python3 scripts/gpu_sampled_diff.py --out /tmp/sampled --rows "${ROWS:-600}" --fp8 > "$OUT/sampled.txt" 2>&1
  echo "exit $? after ${SECONDS}s" >> "$OUT/sampled.txt"
  cp /tmp/sampled/sampled-summary.json "$OUT/" 2>/dev/null
  (cd scripts && timeout $((570 - SECONDS)) python3 bench_fp8_read.py --dir /tmp/fp8read --samples 32 --hidden 5120 \
    --reps 2 --workers 0,8 --json "$OUT/read-fp8-16cores.json" > "$OUT/read-fp8-16cores.txt" 2>&1)
  echo "exit $? after ${SECONDS}s" >> "$OUT/read-fp8-16cores.txt"
fi

#!/usr/bin/env bash
# The GPU runs behind docs/notes/gpu-report.md and docs/notes/benchmarks-history.md (an H200 machine with no network).
# Wheels the machine lacks are carried in .whl/ (made by scripts/prepare_gpu_wheels.sh), causal-conv1d
# as its source distribution patched to build for sm_90 only.
#   bash scripts/gpu_run.sh 1   # install, start the causal-conv1d build, run the seed experiment
#   bash scripts/gpu_run.sh 2   # add the fla+causal-conv1d variant and its diffs, run the build benchmarks
set -u
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SEED=/tmp/seed
if [ "$1" = 1 ]; then
  [ -e /tmp/cc1d.log ] || { mkdir -p /tmp/cc && tar xzf .whl/cc1d-src-sm90.tar.gz -C /tmp/cc; }
  [ -e /tmp/cc1d.log ] || (cd /tmp/cc/causal_conv1d-1.7.0 && CC1D_ONLY_SM90=1 CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=6 \
     setsid nohup sh -c 'python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/ccw . > /tmp/cc1d.log 2>&1; echo "exit $?" >> /tmp/cc1d.log' >/dev/null 2>&1 &)
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|fla-core|flash-linear|zarr|numcodecs|triton) "; } > "$OUT/machine.txt"
  python3 scripts/seed_experiment.py --out $SEED --size gpu --long-rows 72 --cpu-limit 4 > "$OUT/seed.log" 2>&1
  echo "seed exit $?" >> "$OUT/seed.log"
  cp $SEED/report.md "$OUT/report.md"
  tar czf "$OUT/seed.tgz" -C $SEED --exclude store.zarr .
  tail -3 /tmp/cc1d.log > "$OUT/cc1d-so-far.txt"
else
  for i in $(seq 1 80); do grep -q "^exit" /tmp/cc1d.log 2>/dev/null && break; sleep 5; done
  tail -20 /tmp/cc1d.log > "$OUT/cc1d.log"
  if ls /tmp/ccw/causal_conv1d-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site /tmp/ccw/causal_conv1d-*.whl
    python3 -m hsstore env --model builtin:tiny-qwen3_5 --json > "$OUT/env-cc1d.json" 2>&1
    if [ -d $SEED/store.zarr ]; then
      python3 -m hsstore build $SEED/seed.toml --device cuda --backend fla --dtype bf16 --quiet --json > $SEED/build-cuda-fla-cc1d.json 2>> "$OUT/phase2.log"
      S=$SEED/store.zarr
      python3 -m hsstore diff "$S#device=cuda,backend=torch,dtype=bf16" "$S#device=cuda,causal_conv1d=causal_conv1d" \
        --floor "$S#device=cuda,backend=torch,dtype=fp32" --device cuda --json $SEED/diff-fla-cc1d-vs-torch-bf16.json \
        --plot $SEED/diff-fla-cc1d-vs-torch-bf16.png > $SEED/diff-fla-cc1d-vs-torch-bf16.txt 2>> "$OUT/phase2.log"
      python3 -m hsstore info $S --json > $SEED/info.json 2>> "$OUT/phase2.log"
    fi
  fi
  python3 scripts/bench_build.py --shape 27b --device cuda --rows 32 --length 2048 --codecs none,zstd \
    --store-dir /tmp/bench --json $SEED/bench-27b.json > "$OUT/bench.txt" 2>&1
  python3 scripts/bench_build.py --shape tiny --device cuda --rows 512 --length 512 --codecs none,zstd \
    --store-dir /tmp/bench --json $SEED/bench-tiny.json >> "$OUT/bench.txt" 2>&1
  tar czf "$OUT/seed2.tgz" -C $SEED --exclude store.zarr .
fi

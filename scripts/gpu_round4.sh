#!/usr/bin/env bash
# Host/GPU measurements of round 4 on one H200 machine (no network; wheels carried in .whl/, made by
# scripts/prepare_gpu_wheels.sh). Sections, any order:
#   diff      diff time / read time on the host's CPUs and with --device cuda (scripts/bench_diff.py)
#   filehash  weight-file hashing throughput, a 54 GB sparse set and 16 GB of real files (scripts/bench_filehash.py)
#   signals   SIGTERM to a GPU build: exit 143, no process left holding the GPU
#   check     `hsstore check` against a store built on the GPU (bf16, fp32): what equality holds there
# Results land in $OUT (JSON and logs).
set -u
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; free -g | head -2; df -h /tmp | tail -1
  python3 -c "import torch, transformers, zarr; print(torch.__version__, transformers.__version__, zarr.__version__)"; } > "$OUT/machine.txt" 2>&1

diff_section() {
  python3 scripts/bench_diff.py --dir /tmp/hsdiff --samples 128 --hidden 2048 --layers 4 --reps 3 \
    --json "$OUT/h200-diff-cpu.json" > "$OUT/diff-cpu.log" 2>&1; echo "exit $?" >> "$OUT/diff-cpu.log"
  python3 scripts/bench_diff.py --dir /tmp/hsdiff --samples 128 --hidden 2048 --layers 4 --reps 3 --device cuda \
    --json "$OUT/h200-diff-cuda.json" > "$OUT/diff-cuda.log" 2>&1; echo "exit $?" >> "$OUT/diff-cuda.log"
  rm -rf /tmp/hsdiff
}

filehash_section() {
  { python3 scripts/bench_filehash.py --kind sparse --total-gb 54 --files 11 --threads 1 8 16
    python3 scripts/bench_filehash.py --kind real --total-gb 16 --files 4 --threads 1 8; } > "$OUT/h200-filehash.jsonl" 2> "$OUT/filehash.log"
}

signals_section() {
  local s=/tmp/sig.zarr
  python3 -m hsstore build manifests/tiny.toml --device cuda --store $s --quiet --dtype bf16 & local d=$!
  # stop it once its worker holds the GPU (a CUDA context), i.e. mid model load or mid capture
  for i in $(seq 1 600); do [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 0.1; done
  sleep 1; kill -TERM $d; wait $d; local rc=$?
  sleep 2
  { echo "driver exit $rc (expect 143)"; echo "processes on the GPU after 2 s:"
    nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader; echo "(end)"
    python3 -m hsstore build manifests/tiny.toml --device cuda --store $s --quiet --dtype bf16; echo "resume exit $?"
    python3 -m hsstore verify $s | head -3; } > "$OUT/signals.txt" 2>&1
}

check_section() {
  local s=/tmp/chk.zarr
  { python3 -m hsstore build manifests/tiny.toml --device cuda --store $s --quiet --dtype bf16 --dtype fp32 --json > "$OUT/check-build.json"
    for d in bf16 fp32; do
      python3 -m hsstore check builtin:tiny-qwen3_5 "$s#dtype=$d" --samples 16 --json "$OUT/h200-check-$d.json"; echo "check $d exit $?"
    done; } > "$OUT/check.log" 2>&1
}

for section in "$@"; do "${section}_section"; done
ls -la "$OUT"

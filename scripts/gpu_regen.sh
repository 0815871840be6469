#!/usr/bin/env bash
# The GPU regeneration run of issue 40, in one command on one H100/H200 (no network; .whl/ carried, made by
# scripts/prepare_gpu_wheels.sh regen):
#   1. `hsstore build manifests/gpu-8b-regen.toml`: a random-init Llama-3-8B-shaped builtin, bf16, regenerates
#      the last reply of $PROMPTS distinct prompts (greedy, $NEW new tokens) in process, then captures layers
#      1, 8, 15, 22 and 29; `hsstore info --json` of the store;
#   2. scripts/bench_generate.py on the same manifest: hsstore's regeneration against a plain batched
#      model.generate loop ($REPEAT times each, fastest kept), and a regenerating build against generation alone;
#   3. with the time left, `hsstore plan --calibrate 1` of the same build (its estimate against step 1).
# ONLY=bench runs step 2 alone, generation only (--no-build; a second look at the hsstore/plain ratio);
# BENCH_TAG names its files (bench-$BENCH_TAG.json), so two such runs in one call (say, one under
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) keep both.
# Logs and JSON go to $OUT (8 flat files). A CPU dry run of the same steps (minutes on two busy cores):
#   SHAPE=tiny DEVICE=cpu PROMPTS=8 NEW=8 PY=.venv/bin/python OUT=out/regen-dry bash scripts/gpu_regen.sh
# (PY given: the wheels are not installed, that python's packages are used; SHAPE=tiny keeps the 32 layers
# and the layer ids but makes them 64 wide.)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-regen} SHAPE=${SHAPE:-8b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bf16}
PROMPTS=${PROMPTS:-200} NEW=${NEW:-256}  # REPEAT: unset = 2, or 1 if time is short
WORK=/tmp/hsstore-gpu-regen  # the manifest's data file and store live here
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then
  PY=python3
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # (a dry run may put a wheel overlay there)
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; nproc
  $PY - <<'PY'
import sys, importlib.metadata as md
print("python", sys.version.split()[0])
for n in ("torch", "transformers", "zarr", "numcodecs", "msgspec", "huggingface-hub", "tokenizers", "numpy"):
    try:
        print(n, md.version(n))
    except md.PackageNotFoundError:
        print(n, "MISSING")
import tomllib
from packaging.requirements import Requirement
wanted = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]  # hsstore's, then the wheels'
for name in ("transformers", "zarr", "numcodecs", "donfig"):
    wanted += [f"{r} ; via {name}" for r in md.requires(name) or []]
for line in wanted:
    r = Requirement(line.split(" ; via ")[0])
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    try:
        v = md.version(r.name)
    except md.PackageNotFoundError:
        v = None
    if v is None or not r.specifier.contains(v, prereleases=True):
        print("UNMET", line, "have", v)
import torch
print("cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))
PY
  echo "SHAPE=$SHAPE DEVICE=$DEVICE DTYPE=$DTYPE PROMPTS=$PROMPTS NEW=$NEW REPEAT=${REPEAT:-auto}"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# The prompts: the bundled conversations cycled to $PROMPTS rows, each made distinct (a numbered first user
# turn), so no two rows share a content key; their last assistant turn is what the target regenerates.
rm -rf "$WORK" && mkdir -p "$WORK"
$PY - "$PROMPTS" "$WORK/prompts.jsonl" <<'PY'
import json, sys
n, path = int(sys.argv[1]), sys.argv[2]
rows = [json.loads(x) for x in open("hsstore/data/conversations.jsonl") if x.strip()]
with open(path, "w") as f:
    for i in range(n):
        row = json.loads(json.dumps(rows[i % len(rows)]))
        turns = row.get("messages") or row["conversations"]
        user = next(t for t in turns if t.get("role", t.get("from")) in ("user", "human"))
        key = "content" if "content" in user else "value"
        user[key] = f"[{i}] {user[key]}"
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
PY
# The manifest, as run: the repo's, with $NEW new tokens, and for SHAPE=tiny a 64-wide model of the same depth.
M=$WORK/m.toml
sed "s/^max_new_tokens = .*/max_new_tokens = $NEW/" manifests/gpu-8b-regen.toml > "$M"
if [ "$SHAPE" = tiny ]; then
  sed -i 's/^config = .*/config = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 32, num_attention_heads = 4, num_key_value_heads = 2 }/' "$M"
fi
cp "$M" "$OUT/manifest.toml"
LIMIT=${LIMIT:-530}  # seconds this script may take (the device call's 600 s, less the wheels and a margin)
left() { echo $((LIMIT - SECONDS > 30 ? LIMIT - SECONDS : 30)); }

if [ "${ONLY:-}" = bench ]; then
  T=${BENCH_TAG:+-$BENCH_TAG}
  t0=$SECONDS
  timeout "$(left)" $PY scripts/bench_generate.py --manifest "$M" --device "$DEVICE" --dtype "$DTYPE" --no-build \
    --prompts "$PROMPTS" --repeat "${REPEAT:-2}" --json "$OUT/bench$T.json" > "$OUT/bench$T.log" 2>&1
  echo "bench exit $? ($((SECONDS - t0)) s)" | tee -a "$OUT/bench$T.log"
  grep -E "^(cold|plain|hsstore)" "$OUT/bench$T.log"
  exit 0
fi
t0=$SECONDS
timeout 300 $PY -m hsstore build "$M" --device "$DEVICE" --dtype "$DTYPE" --json > "$OUT/build.json" 2>> "$OUT/build.log"
echo "build exit $? ($((SECONDS - t0)) s)" | tee -a "$OUT/build.log"
$PY -m hsstore info "$WORK/store.zarr" --json > "$OUT/info.json" 2>> "$OUT/build.log"
echo "info exit $?" | tee -a "$OUT/build.log"
# The build's generation time (one wall time per batch in its ledger) sizes the bench: it generates
# 2 x REPEAT + 1 times; with too little time left for REPEAT=2, it runs once each.
GEN=$($PY - "$OUT/build.json" <<'PY'
import json, sys
try:
    ledger = json.load(open(sys.argv[1]))["ledger"]
    print(round(sum({json.loads(x)["seconds"] for x in open(ledger) if x.strip()})))
except (OSError, ValueError, KeyError):
    print(0)
PY
)
if [ -z "${REPEAT:-}" ]; then
  REPEAT=2; [ $((5 * GEN + 90)) -gt "$(left)" ] && REPEAT=1
fi
echo "build generation ${GEN} s; bench --repeat $REPEAT with $(left) s left" | tee -a "$OUT/build.log"
rm -rf "$WORK/store.zarr"  # the bench builds its own stores; free the disk first

t0=$SECONDS
timeout "$(left)" $PY scripts/bench_generate.py --manifest "$M" --device "$DEVICE" --dtype "$DTYPE" \
  --prompts "$PROMPTS" --repeat "$REPEAT" --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench exit $? ($((SECONDS - t0)) s)" | tee -a "$OUT/bench.log"

# Last, with the time left: plan's estimate of the same build (generation calibrated on one batch when
# there is time for it), to set against what the build took.
CAL=0; [ "$(left)" -gt 120 ] && CAL=1
t0=$SECONDS
timeout "$(left)" $PY -m hsstore plan "$M" --device "$DEVICE" --dtype "$DTYPE" --calibrate $CAL --json \
  > "$OUT/plan.json" 2>> "$OUT/build.log"
echo "plan --calibrate $CAL exit $? ($((SECONDS - t0)) s)" | tee -a "$OUT/build.log"
$PY - "$OUT/bench.json" <<'PY'
import json, sys
try:
    b = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no bench result: {e}")
print({k: b[k] for k in ("plain_tokens_per_s", "hsstore_tokens_per_s", "hsstore_vs_plain", "batches")},
      {k: b["build"][k] for k in ("seconds", "generation_seconds", "overhead_vs_generation", "samples")})
PY
echo "total $SECONDS s"

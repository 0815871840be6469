#!/usr/bin/env bash
# Prepares .whl/ for scripts/gpu_run.sh and scripts/gpu_fp8.sh on a GPU machine that has no network (run
# it here, with PyPI, from a fresh clone): Python 3.12 wheels of what that machine lacks, and
# causal-conv1d's source distribution patched so that CC1D_ONLY_SM90=1 builds for sm_90 (H100/H200) only
# (~6 minutes instead of every architecture).
#
# pip can only download a source distribution after running its setup.py, and causal-conv1d's imports
# torch: that step runs in the project's .venv (made by scripts/setup.sh if it is missing; it holds the
# CPU torch), never in whatever python3 is on PATH.
#
# `bash scripts/prepare_gpu_wheels.sh regen` prepares only what scripts/gpu_regen.sh (issue 40) needs
# (backend torch: no fla, no causal-conv1d, no datasets; ~16 MB of the 64 MiB that may travel), pinned and
# each one's needs checked against the image's packages (KINDS.md of the device tool: Python 3.12, torch 2.11,
# transformers 5.17, huggingface-hub 1.33, tokenizers 0.23, numpy 2.5, typer, rich, xxhash, numba):
#   transformers 5.24.0  the version the earlier GPU runs carried; 5.25 would need huggingface-hub >= 2.4 and kernels;
#   zarr 3.4.2, numcodecs 0.17.1, donfig, google-crc32c  the store; msgspec, crc32c  hsstore's records and checksums.
# That mode empties .whl/ first: two versions of one package would stop the install there.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)  # worktrees too
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
[ "${1:-}" = regen ] && rm -rf .whl
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_5_x86_64)
if [ "${1:-}" = regen ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
    transformers==5.24.0 zarr==3.4.2 numcodecs==0.17.1 donfig==0.8.1.post1 google-crc32c==1.9.0 msgspec==0.23.0 \
    crc32c==2.9.post0
  du -sh .whl
  ls .whl
  exit 0
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
  zarr numcodecs donfig msgspec crc32c google-crc32c fla-core==0.6.0 flash-linear-attention==0.6.0 \
  transformers==5.24.0 datasets==5.2.0 dill multiprocess xxhash
[ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null || bash scripts/setup.sh
.venv/bin/python -m pip install -q --disable-pip-version-check wheel setuptools  # setup.py's bdist_wheel
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE .venv/bin/python -m pip download -q --no-deps --no-binary :all: \
  --no-build-isolation -d "$tmp" causal-conv1d==1.7.0
tar xzf "$tmp"/causal_conv1d-1.7.0.tar.gz -C "$tmp"
.venv/bin/python - "$tmp/causal_conv1d-1.7.0/setup.py" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
marker = '            cc_flag.append("arch=compute_121,code=sm_121")\n'
assert marker in s, "causal-conv1d's setup.py changed; update the patch"
s = s.replace(marker, marker + '        if os.getenv("CC1D_ONLY_SM90"):\n'
              '            cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]\n', 1)
open(path, "w").write(s)
PY
tar czf .whl/cc1d-src-sm90.tar.gz -C "$tmp" causal_conv1d-1.7.0
du -sh .whl
ls .whl

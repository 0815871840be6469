#!/usr/bin/env bash
# Prepares .whl/ for scripts/gpu_regen.sh (issue 40) on a GPU machine that has no network; run it here, with
# PyPI. Only what that run needs (backend torch: no fla, no causal-conv1d, no datasets), ~16 MB of the 64 MiB
# that may travel. .whl/ is emptied first: two versions of one package would stop the install there.
#
# The machine's image has Python 3.12, torch 2.11, transformers 5.17, huggingface-hub 1.33, tokenizers 0.23,
# numpy 2.5, typer, rich, xxhash and numba (KINDS.md of the device tool). Carried, each with its needs checked
# against that list (`unzip -p .whl/X.whl '*/METADATA' | grep ^Requires-Dist`; scripts/gpu_regen.sh prints
# any that is unmet there):
#   transformers 5.24.0  the version the earlier GPU runs carried (docs/gpu-report.md); 5.25 would need
#                        huggingface-hub >= 2.4 and kernels as well;
#   zarr 3.4.2, numcodecs 0.17.1, donfig, google-crc32c  the store (zarr needs donfig and google-crc32c);
#   msgspec, crc32c      hsstore's records and checksums.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)  # worktrees too
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
rm -rf .whl
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
  transformers==5.24.0 zarr==3.4.2 numcodecs==0.17.1 donfig==0.8.1.post1 google-crc32c==1.9.0 msgspec==0.23.0 \
  crc32c==2.9.post0
du -sh .whl
ls .whl

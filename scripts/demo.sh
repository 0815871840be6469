#!/usr/bin/env bash
# Sets up, then runs the main job on the embedded default: builds manifests/tiny.toml (a random-init
# hybrid Gated-DeltaNet model, an offline tokenizer, 120 bundled conversations) as two variants
# (bf16 and fp32), shows them, verifies the store and diffs the two variants.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/hsstore build manifests/tiny.toml
.venv/bin/hsstore info out/tiny.zarr
.venv/bin/hsstore verify out/tiny.zarr
.venv/bin/hsstore diff 'out/tiny.zarr#dtype=bf16' 'out/tiny.zarr#dtype=fp32'

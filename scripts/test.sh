#!/usr/bin/env bash
# Sets up, then runs the whole test suite (real stores, real models, real torchrun/gloo processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Sets up, then runs the whole test suite (real stores, real models, real torchrun/gloo processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# two pytest workers (pytest-xdist): most tests wait on real build subprocesses, so two run side by side
# even on a 2-core machine; HSSTORE_TEST_WORKERS=0 runs in one process
.venv/bin/python -m pytest -n "${HSSTORE_TEST_WORKERS:-2}" "$@"

#!/usr/bin/env bash
# Sets up, then runs the whole test suite (real stores, real models, real torchrun/gloo processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# three pytest workers (pytest-xdist) even on a 2-core machine: tests wait on real build subprocesses,
# signals and servers part of the time (7.5 min with 3 workers against 8.8 with 2 here); work stealing
# keeps the long process tests from ending the run on one worker. HSSTORE_TEST_WORKERS=0: one process
.venv/bin/python -m pytest -n "${HSSTORE_TEST_WORKERS:-3}" --dist worksteal "$@"

#!/usr/bin/env bash
# The long store-fuzz run (numbers in docs/fuzz.md): seeded mutations of good stores against every reading
# entry point (tests/storage/test_store_fuzz.py, widened).
#   bash scripts/fuzz_store.sh [CASES] [SEED]     # default 10000 cases, seed 1
set -euo pipefail
cd "$(dirname "$0")/.."
export HSSTORE_FUZZ_CASES="${1:-10000}" HSSTORE_FUZZ_SEED="${2:-1}"
exec .venv/bin/python -m pytest -q -n "${HSSTORE_TEST_WORKERS:-2}" tests/storage/test_store_fuzz.py

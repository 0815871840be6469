#!/usr/bin/env bash
# Reproduces the seed comparison on the embedded hybrid model: torch-fallback variants on CPU (bf16 and
# the fp32 floor) and, where a GPU with fla is present, the CUDA torch and fla variants; prints verdicts.
#   bash scripts/seed_experiment.sh [OUT] [tiny|gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/seed_experiment.py --out "${1:-out/seed}" --size "${2:-tiny}"

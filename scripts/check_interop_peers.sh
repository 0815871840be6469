#!/usr/bin/env bash
# Proves hsstore's import/export against the real speculators, SpecForge, Model-Optimizer and EAGLE
# loaders (CPU, no GPU stack): results in docs/data/interop-peers.json (summary: docs/interop.md).
# The peers live in their own virtualenv (.venv-peers): a plain `pip install speculators` pulls a multi-GB
# CUDA torch, so torch 2.13.0 (CPU) goes first and the peers come in with --no-deps, then what their data
# code imports (speculators' recipe from issue "Interop"; SpecForge pins sglang, which is GPU-only).
set -euo pipefail
cd "$(dirname "$0")/.."
V="${HSSTORE_PEER_VENV:-.venv-peers}"
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$V/bin/pip" install -q --disable-pip-version-check --no-deps speculators==0.9.0 hs-connectors==0.9.0 \
    specforge==0.2.0 nvidia-modelopt==0.47.0 eagle-llm==1.2.1
  "$V/bin/pip" install -q --disable-pip-version-check "transformers==5.19.0" "datasets<=5.1.0" loguru pydantic \
    pydantic-settings safetensors rich typer click httpx aiohttp openai requests scipy pulp omegaconf nvidia-ml-py regex
fi
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/python scripts/check_interop_peers.py --peer-python "$V/bin/python" "$@"

#!/usr/bin/env bash
# Creates .venv with hsstore installed (editable) and its test extras. torch comes first and pinned:
# torch==2.13.0 is the CPU build these machines carry; a bare "torch" could pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${HSSTORE_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"

#!/usr/bin/env bash
# Sets up, then runs the whole test suite (real stores, real models, real torchrun/gloo processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# bytecode is cached (hsstore's modules, pytest's rewritten tests): with PYTHONDONTWRITEBYTECODE=1 (set on some
# images) every pytest worker rewrote the tests (5.4 CPU-s a collection, 2.9 cached) and each process the tests
# start compiled hsstore again (~0.4 of a build's ~6 CPU-s; docs/testing.md)
unset PYTHONDONTWRITEBYTECODE
# two pytest workers (pytest-xdist), one per core of a 2-core machine: builds and CLI calls run in the
# test process (tests/inline_cli.py); tests marked `process` start real ones (docs/testing.md says which
# and why, and how long the suite takes). HSSTORE_TEST_WORKERS=0 runs in one process; -m "not process"
# leaves the real-process tests out (a quick local loop; CI runs everything)
.venv/bin/ruff check -q hsstore tests scripts  # lint first: a second, not minutes
.venv/bin/ruff format --check -q hsstore tests scripts  # formatted as ruff formats (pyproject's [tool.ruff.format])
# types next (pyproject's [tool.mypy]: strict on core/storage/read, every module clean, no baseline);
# offline, ~20 s with its cache (.mypy_cache), ~4 min cold on a shared 2-core machine
.venv/bin/mypy
# --dist worksteal: xdist's default ("load") hands each worker a first chunk of 1/8 of the tests in order, so every
# `process` test (sorted first, tests/conftest.py) went to one worker, which ran them alone for minutes after the
# other had finished the short ones (8 min 39 s against 6 min 26 s, docs/testing.md); stealing rebalances the queues
.venv/bin/python -m pytest -n "${HSSTORE_TEST_WORKERS:-2}" --dist worksteal "$@"

#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q "$@"

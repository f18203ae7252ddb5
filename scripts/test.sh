#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers, a test module each at a time (modules longest first, tests/conftest.py): most tests spend
# their time tracing TensorFlow functions on one core. `scripts/test.sh -n 0 tests/test_x.py` runs serially.
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"

#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, then the test suite.
#   scripts/test.sh          the whole suite: what CI runs; run it before committing. It first builds the images
#                            (scripts/images.sh: Docker installed and started where needed), which its tests run
#   scripts/test.sh --fast   the everyday tier while working: leaves out the tests marked slow (pytest.ini)
# Other arguments go to pytest: `scripts/test.sh -n 0 tests/test_x.py` runs one module serially.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then tier=(-m "not slow"); else args+=("$arg"); fi
done
scripts/setup_env.sh
# The suite sets the environment it relies on, whatever the caller exported (tests/suite_env.py, applied by
# tests/conftest.py before TensorFlow is imported). These few are read when pytest's own interpreter starts,
# before any conftest runs (suite_env.PYTHON_STARTUP), so they are cleared here.
unset PYTHONWARNINGS PYTHONOPTIMIZE PYTHONDEVMODE PYTHONINSPECT PYTHONPATH
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The suite leaves no temporary file behind. Its TMPDIR (inherited by every process a test starts) is a
# directory of this run: whatever is left in it at the end is named, fails the run and is removed. pytest's
# own tmp_path directories stay where they always are (pytest keeps the last three runs'), beside it.
export PYTEST_DEBUG_TEMPROOT=${PYTEST_DEBUG_TEMPROOT:-${TMPDIR:-/tmp}}
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/effnet-tests.XXXXXX")
# shellcheck source=scripts/docker_daemon.sh
. scripts/docker_daemon.sh
trap 'rm -rf "$run_tmp"; docker_down' EXIT
if [ ${#tier[@]} -eq 0 ]; then
  # The whole suite runs the images (tests/test_images_built.py, the rehearsed slices' worker 0): built first,
  # in seconds once their dependencies' layers exist. CI must have them; elsewhere their tests are skipped.
  if ! { docker_up && scripts/images.sh build pipeline trainer-tpu; }; then
    [ -z "${CI:-}" ] || exit 1
    echo "note: no images (see above): the tests that run them are skipped" >&2
  fi
fi
# Two workers, each taking the next unit of work when free: a module's tests, or a long test on its own, longest
# first (tests/conftest.py). Most tests spend their time tracing TensorFlow functions on one core.
status=0
TMPDIR=$run_tmp .venv/bin/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --durations=25 \
  ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"} || status=$?
# TensorFlow removes the sources it generates for autograph when its process exits; pytest-xdist stops a worker
# that has not exited 10 s after the run (execnet), before those exit handlers run, which a loaded machine
# makes likely. Those are named and removed, and do not fail the run; anything else left does.
generated=$(cd "$run_tmp" && ls -A | grep -c '^__autograph_generated_file.*[.]py$' || true)
if [ "$generated" -gt 0 ]; then
  echo "note: $generated of TensorFlow's generated autograph sources were left by a process stopped before it" \
    "exited (removed now)" >&2
fi
left=$(cd "$run_tmp" && ls -A | grep -v '^__autograph_generated_file.*[.]py$' || true)
if [ -n "$left" ]; then
  echo "error: the tests left these in their TMPDIR ($run_tmp), removed now:" >&2
  echo "$left" | sed 's/^/  /' >&2
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"

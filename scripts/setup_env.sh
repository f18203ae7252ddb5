#!/usr/bin/env bash
# Creates .venv and installs the project with its pinned stack, once. A second run is a no-op unless
# setup.py or constraints.txt changed (their hash is kept in .venv/.effnet-install-stamp).
#
# --ignore-requires-python: tfx 1.16.0 and ml-pipelines-sdk 1.16.0 declare Requires-Python <3.11 although
# every compiled library under them (ml-metadata, tfx-bsl, tensorflow-data-validation) ships cp311 wheels
# and declares 3.11 support. TFX 1.17+ needs glibc 2.38+ wheels that do not load on Debian 12.
#
# One line per phase on stderr; the installers' own output goes to .venv/setup.log and is shown only when a
# phase fails (pip's warnings about a machine's extra find-links and setuptools' editable-install notice are
# hundreds of lines a user need not read).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.effnet-install-stamp
want=$(cat setup.py constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
start=$SECONDS
log=.venv/setup.log

phase() {
  local what=$1
  shift
  echo "[setup] $what" >&2
  if ! "$@" >>"$log" 2>&1; then
    echo "[setup] failed: $what. The installer's output (all of it in $log):" >&2
    tail -n 40 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv .venv
fi
: >"$log"
phase "updating pip, setuptools and wheel" .venv/bin/python -m pip install --upgrade pip setuptools wheel
phase "installing the pinned stack into .venv (about 2-5 minutes the first time)" \
  .venv/bin/python -m pip install --ignore-requires-python -c constraints.txt -e '.[dev]'
echo "$want" >"$stamp"
echo "[setup] ready in $((SECONDS - start)) s (installer output: $log)" >&2

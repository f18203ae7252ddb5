#!/usr/bin/env bash
# Creates .venv and installs the project with its pinned stack, once. A second run is a no-op unless
# setup.py or constraints.txt changed (their hash is kept in .venv/.effnet-install-stamp).
#
# --ignore-requires-python: tfx 1.16.0 and ml-pipelines-sdk 1.16.0 declare Requires-Python <3.11 although
# every compiled library under them (ml-metadata, tfx-bsl, tensorflow-data-validation) ships cp311 wheels
# and declares 3.11 support. TFX 1.17+ needs glibc 2.38+ wheels that do not load on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.effnet-install-stamp
want=$(cat setup.py constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "[setup] installing the pinned stack into .venv (about 2-5 minutes the first time)" >&2
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q --ignore-requires-python -c constraints.txt -e '.[dev]'
echo "$want" > "$stamp"

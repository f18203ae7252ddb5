#!/usr/bin/env bash
# Creates .venv and installs the project with its pinned stack, once. A second run is a no-op unless
# setup.py or constraints.txt changed (their hash is kept in .venv/.effnet-install-stamp).
#
# The installer is uv (from PyPI, pinned in constraints.txt, installed into .venv by the venv's own pip): a
# fresh clone to a pushed model took 260 and 289 s with it against 496 and 409 s with pip on a loaded 2-core
# machine (docs/performance.md, "Set-up"). It installs the same pins (-c constraints.txt) and, unlike pip, needs no
# --ignore-requires-python: tfx 1.16.0 and ml-pipelines-sdk 1.16.0 declare Requires-Python <3.11, an upper
# bound uv does not enforce (every compiled library under them, ml-metadata, tfx-bsl,
# tensorflow-data-validation, ships cp311 wheels and declares 3.11 support; TFX 1.17+ needs glibc 2.38+ wheels
# that do not load on Debian 12). It byte-compiles what it installs (--compile-bytecode): this machine, like CI's,
# sets PYTHONDONTWRITEBYTECODE=1, so Python never caches a module it compiles, and without the .pyc files every
# process compiled TensorFlow's and TFX's sources again as it imported them: `import tensorflow` took 20 s
# against 8 s with them (2026-11-28, 2 cores), and the suite starts several hundred such processes. Compiling
# adds about 20 s to the install (47 s -> 67 s here). pip and setuptools in .venv are brought to their current
# releases (the venv's own are Python 3.11's bundled ones), as the pip-based set-up did.
#
# One line per phase on stderr; the installers' own output goes to .venv/setup.log and is shown only when a
# phase fails (pip's warnings about a machine's extra find-links and setuptools' editable-install notice are
# hundreds of lines a user need not read). The stamp covers this script too, so a change of how it installs
# (such as byte-compiling) reaches every existing .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.effnet-install-stamp
want=$(cat setup.py constraints.txt scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
start=$SECONDS
log=.venv/setup.log
# The installers' temporary files go to a directory of this run's, removed when it ends however it ends: uv
# leaves a lock file in the temporary directory for every package it builds from source (17 on a fresh set-up).
install_tmp=$(mktemp -d "${TMPDIR:-/tmp}/effnet-setup.XXXXXX")
trap 'rm -rf "$install_tmp"' EXIT
trap 'echo "[setup] stopped; the same command finishes the set-up" >&2; exit 130' INT TERM
export TMPDIR=$install_tmp

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

fresh=0
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv .venv
  fresh=1
fi
: >"$log"
phase "installing the installer (uv)" .venv/bin/python -m pip install -c constraints.txt uv
phase "installing the pinned stack into .venv (about 1-2 minutes the first time)" \
  .venv/bin/uv pip install --python .venv/bin/python -c constraints.txt -e '.[dev]' --compile-bytecode \
  --upgrade-package pip --upgrade-package setuptools pip setuptools
if [ "$fresh" = 0 ]; then
  # uv compiles what it installs now; an existing .venv's packages, installed before, are compiled here once.
  phase "byte-compiling the installed packages (about a minute, once)" \
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m compileall -q -j 0 .venv/lib
fi
echo "$want" >"$stamp"
echo "[setup] ready in $((SECONDS - start)) s (installer output: $log)" >&2

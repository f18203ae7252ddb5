#!/usr/bin/env bash
# The main job on the embedded default data: the whole TFX pipeline with the LocalDagRunner, from
# ILSVRC2012-style archives of scikit-learn's real digits (ten real synsets) to a blessed, pushed EfficientNet.
# Extra arguments go to `python -m pipeline.local_runner` (for example --preset smoke, --target-top1 0.99,
# --tune; `scripts/demo.sh --help` lists them). It prints a short account (each step, one line per evaluation,
# the verdict); the libraries' logs go to PIPELINE_ROOT/logs/local_runner-<time>.log, or live to the terminal
# with --verbose. Exit status: 0 pushed, 3 the model missed its target, 2 a bad flag or input, 130 Ctrl-C (the
# same command then goes on from the steps that finished, a stopped training from its checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pipeline.local_runner --pipeline-root outputs/pipeline "$@"

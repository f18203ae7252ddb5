#!/usr/bin/env bash
# The main job on the embedded default data: scikit-learn's real scanned digits laid out as the ILSVRC2012
# archives (ten real synsets), sharded for 2 hosts by beam_preprocess on the DirectRunner with 2 worker threads.
# Extra arguments go to `python -m beam_preprocess` (for example --num-hosts 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::FutureWarning}
out=outputs/demo
if [ ! -f "$out/archives/ILSVRC2012_img_val.tar" ]; then
  .venv/bin/python -m beam_preprocess.sample_data --out "$out/archives"
fi
.venv/bin/python -m beam_preprocess \
  --train-archive "$out/archives/ILSVRC2012_img_train.tar" \
  --val-archive "$out/archives/ILSVRC2012_img_val.tar" \
  --output-dir "$out/shards" --num-hosts 2 --train-shards 8 --val-shards 2 --overwrite \
  --direct_num_workers 2 --direct_running_mode multi_threading "$@"

"""python -m trainer_module: train, evaluate in the loop and export one EfficientNet run.

Writes MODEL_DIR/export/ (SavedModel: serving_default on serialized tf.Example, serve_jpeg on raw JPEG),
MODEL_DIR/metrics.json (final and peak top-1, evaluation history, time to accuracy, images/s),
MODEL_DIR/run_log.jsonl, MODEL_DIR/config.json, TensorBoard summaries and checkpoints. Re-running with the
same MODEL_DIR resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)

from trainer_module import presets  # noqa: E402
from trainer_module.config import with_overrides  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_module",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1] + "\npresets: " + ", ".join(presets.preset_names()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", required=True, help="named config (see the list below)")
    parser.add_argument("--train-files", required=True, action="append", help="glob of training shards")
    parser.add_argument("--eval-files", required=True, action="append", help="glob of validation shards")
    parser.add_argument("--model-dir", required=True, help="checkpoints, logs, metrics and the export")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override a config field, e.g. --set loop.train_epochs=3 --set data.global_batch_size=128",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-devices", type=int, default=0, help="split the CPU into N logical devices (mirrored strategy)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        config = with_overrides(presets.get_preset(args.preset), args.overrides)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from trainer_module import run, train

    devices = run.use_logical_cpus(args.cpu_devices) if args.cpu_devices else None
    try:
        metrics = run.run(config, args.train_files, args.eval_files, train.RunPaths(args.model_dir), devices)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in metrics.items() if k != "history"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

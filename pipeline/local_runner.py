"""python -m pipeline.local_runner: the whole pipeline on this machine with the TFX LocalDagRunner.

Runs on the embedded default data (scikit-learn's real digits laid out as the ILSVRC2012 archives) unless
archives or directories are given. Metadata goes to a SQLite store under the pipeline root, so a second run
reuses the cached steps. Ends by printing the top-1 the Evaluator measured, whether the model was blessed, and
where it was pushed; exits 0 when a model was pushed, 3 when the model missed the target (nothing pushed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
warnings.filterwarnings("ignore", category=FutureWarning)

NOT_BLESSED_EXIT = 3
SETUP_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")


def build_parser() -> argparse.ArgumentParser:
    from pipeline import presets

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.local_runner", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--pipeline-root", default="outputs/pipeline", help="artifacts, metadata and pushed models"
    )
    parser.add_argument("--preset", default="demo", choices=sorted(presets.PIPELINE_PRESETS))
    parser.add_argument("--target-top1", type=float, default=None, help="override the preset's top-1 gate")
    parser.add_argument("--train-archive", default="")
    parser.add_argument("--val-archive", default="")
    parser.add_argument("--train-dir", default="")
    parser.add_argument("--val-dir", default="")
    parser.add_argument(
        "--max-failures", type=int, default=0, help="unusable inputs tolerated while sharding"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="trainer config override",
    )
    parser.add_argument(
        "--beam-workers", type=int, default=2, help="DirectRunner worker threads for sharding"
    )
    return parser


def embedded_archives(root: str) -> tuple[str, str]:
    """The embedded digits as ILSVRC2012-style archives under ``root`` (written once, deterministic)."""
    from beam_preprocess import sample_data

    train = os.path.join(root, sample_data.TRAIN_ARCHIVE)
    val = os.path.join(root, sample_data.VAL_ARCHIVE)
    if not (os.path.exists(train) and os.path.exists(val)):
        sample_data.write_digits_archives(root)
    return train, val


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    from tfx import v1 as tfx

    from beam_preprocess.config import ShardingConfig
    from pipeline import outcome, pipeline_def, presets
    from trainer_module.config import with_overrides

    preset = presets.get(args.preset)
    target = preset.target_top1 if args.target_top1 is None else args.target_top1
    root = os.path.abspath(args.pipeline_root)
    train_archive, val_archive = args.train_archive, args.val_archive
    if not (train_archive or val_archive or args.train_dir or args.val_dir):
        train_archive, val_archive = embedded_archives(os.path.join(root, "embedded_data"))
    try:
        sharding = ShardingConfig(
            output_dir=pipeline_def.ARTIFACT_OUTPUT_DIR,
            train_archive=train_archive,
            val_archive=val_archive,
            train_dir=args.train_dir,
            val_dir=args.val_dir,
            num_hosts=preset.num_hosts,
            train_shards=preset.train_shards,
            val_shards=preset.val_shards,
            max_failures=args.max_failures,
        )
        trainer_config = with_overrides(preset.trainer_config(), args.overrides)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = f"effnet-{preset.name}"
    serving_dir = os.path.join(root, "serving_model")
    metadata_path = os.path.join(root, "metadata.sqlite")
    beam_args = [f"--direct_num_workers={args.beam_workers}", "--direct_running_mode=multi_threading"]
    if os.path.exists(SETUP_FILE):
        # Without a setup file, TFX's Beam executor packages TFX itself (a 50 MB sdist) on every run.
        beam_args.append(f"--setup_file={SETUP_FILE}")
    pipeline = pipeline_def.create_pipeline(
        pipeline_name=name,
        pipeline_root=os.path.join(root, "artifacts"),
        sharding=sharding,
        trainer_config=trainer_config,
        target_top1=target,
        serving_model_dir=serving_dir,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path
        ),
        beam_pipeline_args=beam_args,
    )
    tfx.orchestration.LocalDagRunner().run(pipeline)
    result = outcome.read_outcome(metadata_path, name, target)
    print(result.report())
    if result.model_run_uri:
        from trainer_module import report

        print(f"run report: {report.write_report(result.model_run_uri, pipeline=result.report_lines())}")
    print(json.dumps(result.as_dict()))
    return 0 if result.pushed else NOT_BLESSED_EXIT


if __name__ == "__main__":
    sys.exit(main())

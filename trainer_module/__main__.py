"""python -m trainer_module: train, evaluate in the loop and export one EfficientNet run.

With --plan it trains nothing and reads no data: it prints one JSON object with the resolved config, what it
resolves to (steps per epoch, warmup and total steps, peak learning rate, per-replica batch, batch-norm group,
replicas and hosts) and the learning rate at the steps of --lr-steps, to check a preset against a slice before
paying for it.

``python -m trainer_module tune ...`` searches hyperparameters, training each trial as a run of this command
(``python -m trainer_module tune --help``); ``--hyperparameters TUNE_DIR/best_hyperparameters.json`` trains
with what it found.

A training run writes MODEL_DIR/export/ (SavedModel: serving_default on JPEG bytes, serve_tf_examples for TFMA),
MODEL_DIR/metrics.json (final and peak top-1, evaluation history, time to accuracy, images/s),
MODEL_DIR/run_log.jsonl, MODEL_DIR/config.json, TensorBoard summaries (MODEL_DIR/tensorboard) and checkpoints.
Re-running with the same MODEL_DIR resumes from the last checkpoint. The console shows one line per
evaluation; the libraries' logs go to MODEL_DIR/logs/trainer-<time>.log (--verbose: live on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)

# TensorFlow (imported by the presets) prints on import: it is imported inside the console session.
from effnet_common import console  # noqa: E402

LOG_DIR = "logs"


def build_parser() -> argparse.ArgumentParser:
    from trainer_module import presets

    parser = argparse.ArgumentParser(
        prog="python -m trainer_module",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1] + "\npresets: " + ", ".join(presets.preset_names()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", required=True, help="named config (see the list below)")
    parser.add_argument("--train-files", action="append", help="glob of training shards")
    parser.add_argument("--eval-files", action="append", help="glob of validation shards")
    parser.add_argument("--model-dir", help="checkpoints, logs, metrics and the export")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override a config field, e.g. --set loop.train_epochs=3 --set data.global_batch_size=128",
    )  # fmt: skip
    parser.add_argument(
        "--hyperparameters", metavar="JSON",
        help="a search's best_hyperparameters.json (python -m trainer_module tune): applied like --set, before "
        "the --set overrides; warmup and decay epochs scaled to this run's loop.train_epochs",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-devices", type=int, default=0, help="split the CPU into N logical devices (mirrored strategy)"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the resolved config and derived values as JSON; train nothing",
    )
    parser.add_argument(
        "--lr-steps", type=_step_list, default=[], metavar="S1,S2,...",
        help="with --plan: also print the learning rate at these steps",
    )  # fmt: skip
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' logs live instead of writing them to MODEL_DIR/logs/",
    )
    return parser


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated step numbers, got {text!r}") from None
    if any(step < 0 for step in steps):
        raise argparse.ArgumentTypeError(f"steps must be >= 0, got {text!r}")
    return steps


def report_main(argv: list[str]) -> int:
    """``python -m trainer_module report MODEL_DIR``: redraws the run report of a finished or running run."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer_module report",
        description="Draws report.html and its PNG plots from a model directory (local, gs://, ...).",
    )
    parser.add_argument("model_dir", help="the run's model directory")
    args = parser.parse_args(argv)
    from trainer_module import report

    try:
        print(report.write_report(args.model_dir))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _task_suffix() -> str:
    """'' for a single process or the chief; '-worker-1' for another task of a TF_CONFIG cluster (the tasks
    share the model directory, each keeps its own log)."""
    from trainer_module import strategies

    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if strategies.is_chief_task(tf_config):
        return ""
    return f"-{tf_config['task']['type']}-{tf_config['task']['index']}"


def _upload(local_path: str, path: str) -> None:
    from trainer_module import files

    with open(local_path, encoding="utf-8", errors="backslashreplace") as f:
        files.write_text(path, f.read())


def tuned_config(preset: str, overrides: list[str], hyperparameters: str | None):
    """The config of ``preset`` with a search's values (``--hyperparameters``) and then ``overrides``; and the
    values that came from the search and stayed (an explicit ``--set`` of the same key wins).

    Raises:
      console.UsageError: naming the override, or the hyperparameters file and its problem.
    """
    from trainer_module import presets
    from trainer_module.config import with_overrides

    try:
        config = with_overrides(presets.get_preset(preset), overrides)
    except (TypeError, ValueError) as e:
        raise console.UsageError("", "", console.one_line(e)) from None  # the message names the override
    if not hyperparameters:
        return config, {}
    from trainer_module import tuning

    try:
        values = tuning.read_hyperparameters(hyperparameters)
        tuned_overrides, tuned = tuning.hyperparameter_overrides(values, config.loop.train_epochs)
        config = with_overrides(presets.get_preset(preset), tuned_overrides + overrides)
    except (TypeError, ValueError) as e:
        raise console.UsageError("--hyperparameters", hyperparameters, console.one_line(e)) from None
    explicit = {override.partition("=")[0].strip() for override in overrides}
    return config, {key: value for key, value in tuned.items() if key not in explicit}


def check_data(train_files: list[str], eval_files: list[str]) -> None:
    """Each glob of ``--train-files`` / ``--eval-files`` matches a file whose first byte can be read."""
    import tensorflow as tf

    for flag, patterns in (("--train-files", train_files), ("--eval-files", eval_files)):
        for pattern in patterns:
            try:
                matches = tf.io.gfile.glob(pattern)
                if not matches:
                    raise console.UsageError(flag, pattern, "matches no file")
                with tf.io.gfile.GFile(matches[0], "rb") as f:
                    f.read(1)
            except tf.errors.OpError as e:
                raise console.UsageError(
                    flag, pattern, f"cannot read ({console.one_line(e.message)})"
                ) from None


def shard_size_overrides(train_files: list[str], eval_files: list[str]) -> list[str]:
    """The shards' example counts as overrides, where their manifests give them (nothing is read end to end).

    The run takes its epoch from the shards' manifest whatever the preset says (``run.with_data_sizes``), so
    the config is checked against that epoch: batch 4096 of the demo preset on 60,000 sharded images is a
    valid run, though the demo's own data has 1,438. Shards without a manifest are counted by the run.

    Raises:
      console.UsageError: a manifest that does not describe the files beside it, naming the flag.
    """
    import tensorflow as tf

    from trainer_module import shard_files

    overrides = []
    for flag, key, patterns in (
        ("--train-files", "data.num_train_examples", train_files),
        ("--eval-files", "data.num_eval_examples", eval_files),
    ):
        files = shard_files.list_files(patterns)
        manifests = {shard_files.manifest_path_of(f) for f in files}
        if not files or not all(tf.io.gfile.exists(m) for m in manifests):
            continue
        try:
            overrides.append(f"{key}={sum(shard_files.record_counts(files))}")
        except ValueError as e:
            raise console.UsageError(flag, ",".join(patterns), console.one_line(e)) from None
    return overrides


def make_directory(flag: str, path: str) -> None:
    """Creates the output directory ``path`` (last, so that a failed check before leaves nothing behind)."""
    import tensorflow as tf

    try:
        tf.io.gfile.makedirs(path)
        if not tf.io.gfile.isdir(path):
            raise console.UsageError(flag, path, "is not a directory")
    except tf.errors.OpError as e:
        raise console.UsageError(flag, path, f"cannot create it ({e.message})") from None


def preflight(args, parser):
    """The config, the data (each glob matches a readable file), the model directory (created last, so that
    a failed check leaves nothing behind); every path through tf.io.gfile (local, gs://, ram://). Returns
    the config and the settings in it that came from ``--hyperparameters``.

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    if args.plan:
        return tuned_config(args.preset, args.overrides, args.hyperparameters)
    if args.lr_steps:
        parser.error("--lr-steps goes with --plan")
    missing = [flag for flag in ("train_files", "eval_files", "model_dir") if not getattr(args, flag)]
    if missing:
        tuned_config(args.preset, args.overrides, args.hyperparameters)  # a wrong setting first, if any
        parser.error("a training run needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    check_data(args.train_files, args.eval_files)
    sizes = shard_size_overrides(args.train_files, args.eval_files)
    config, tuned = tuned_config(args.preset, args.overrides + sizes, args.hyperparameters)
    make_directory("--model-dir", args.model_dir)
    return config, tuned


def build_tune_parser() -> argparse.ArgumentParser:
    from trainer_module import tuning

    parser = argparse.ArgumentParser(
        prog="python -m trainer_module tune",
        description="Searches hyperparameters; each trial is a run of python -m trainer_module (its in-loop "
        "top-1 the objective). Run again in the same --tune-dir to resume: finished trials are kept.",
    )
    parser.add_argument("--preset", required=True, help="named config the trials start from")
    parser.add_argument("--train-files", action="append", required=True, help="glob of training shards")
    parser.add_argument(
        "--eval-files", action="append", required=True, help="glob of the shards trials evaluate on"
    )
    parser.add_argument("--tune-dir", required=True, help="the search's state, trials and results")
    parser.add_argument("--search", default="hyperband", help=f"one of {', '.join(tuning.SEARCHES.names())}")
    parser.add_argument(
        "--max-epochs", type=int,
        help="every trial's schedule (loop.train_epochs) and Hyperband's longest trial (default: the config's)",
    )  # fmt: skip
    parser.add_argument(
        "--max-trials", type=int, default=10, help="trials of the bayesian and random searches"
    )
    parser.add_argument("--factor", type=int, default=3, help="Hyperband's reduction factor")
    parser.add_argument("--iterations", type=int, default=1, help="times Hyperband runs its brackets")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (trials train with loop.seed)")
    parser.add_argument(
        "--space", action="append", default=[], metavar="KEY=KIND:LOW:HIGH",
        help="tune KEY (kinds log, linear, int; or KEY=choice:A,B), replacing or adding to the default space",
    )  # fmt: skip
    parser.add_argument(
        "--only",
        action="store_true",
        help="tune the --space dimensions only, not the default space beside them",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--cpu-devices", type=int, default=0, help="logical CPU devices of each trial")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' logs live")
    return parser


def tune_preflight(args):
    """The search (config, space, budget), the data, then the directory (created and claimed last).

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    from trainer_module import tuning

    check_data(args.train_files, args.eval_files)
    overrides = args.overrides + shard_size_overrides(args.train_files, args.eval_files)
    tuned_config(args.preset, overrides, None)  # the preset and overrides, in one line if wrong
    try:
        changes = tuple(tuning.Dimension.parse(text) for text in args.space)
    except ValueError as e:
        raise console.UsageError("--space", "", console.one_line(e)) from None
    search = tuning.Search(
        preset=args.preset,
        train_files=tuple(args.train_files),
        eval_files=tuple(args.eval_files),
        overrides=tuple(overrides),
        search=args.search,
        max_epochs=args.max_epochs,
        max_trials=args.max_trials,
        factor=args.factor,
        iterations=args.iterations,
        seed=args.seed,
        cpu_devices=args.cpu_devices,
    )
    try:
        search = tuning.with_space(search, changes, args.only)
    except (TypeError, ValueError) as e:
        raise console.UsageError("", "", console.one_line(e)) from None  # the message names the setting
    make_directory("--tune-dir", args.tune_dir)
    try:
        tuning.claim_directory(search, args.tune_dir)
    except ValueError as e:
        raise console.UsageError("--tune-dir", "", console.one_line(e)) from None
    return search


def tune_main(argv: list[str]) -> int:
    """``python -m trainer_module tune``: one line per trial, then the best values and where they are."""
    with console.session(verbose=console.wants_verbose(argv)) as session:
        args = build_tune_parser().parse_args(argv)
        try:
            search = tune_preflight(args)
        except console.UsageError as e:
            return console.fail(e)
        from trainer_module import files, tuning

        session.keep_log(files.join(args.tune_dir, LOG_DIR, console.log_name("tune")), _upload)
        tuner = tuning.build_tuner(search, args.tune_dir, report=lambda s: console.say(tuning.trial_line(s)))
        console.say(tuning.planned_budget_line(search))
        try:
            tuner.search()
        except RuntimeError as e:  # KerasTuner ends a search after consecutive failed trials
            return console.fail(e, status=1)
        best = tuning.write_summaries(tuner)
        if best is None:
            return console.fail("no trial completed; see " + files.join(args.tune_dir, tuning.TRIALS_FILE), 1)
        console.say(
            "best top-1 %.4f (trial %s): %s", best["top1"], best["trial_id"], tuning.values_text(best)
        )
        console.say("wrote %s", files.join(args.tune_dir, tuning.BEST_HYPERPARAMETERS_FILE))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    if argv[:1] == ["tune"]:
        return tune_main(argv[1:])
    with console.session(verbose=console.wants_verbose(argv)) as session:
        parser = build_parser()
        args = parser.parse_args(argv)
        try:
            config, tuned = preflight(args, parser)
        except console.UsageError as e:
            return console.fail(e)
        if args.plan:
            from trainer_module.dry_run import plan_report

            print(json.dumps(plan_report(config, args.lr_steps), indent=2))
            return 0
        from trainer_module import files, input_pipeline, run, train

        session.keep_log(
            files.join(args.model_dir, LOG_DIR, console.log_name("trainer" + _task_suffix())), _upload
        )
        devices = run.use_logical_cpus(args.cpu_devices) if args.cpu_devices else None
        try:
            result = run.run(
                config, args.train_files, args.eval_files, train.RunPaths(args.model_dir), devices, tuned
            )
        except (input_pipeline.LabelError, train.NonFiniteLossError, ValueError) as e:
            return console.fail(e)
        peak = "none" if result.peak_top1 is None else f"{result.peak_top1:.4f} at step {result.peak_step}"
        if result.stopped_at_epoch is None:
            console.say("peak top-1 %s; exported to %s", peak, result.export_dir)
        else:
            console.say(
                "peak top-1 %s; stopped at epoch %d of %d (run again with a later loop.stop_at_epoch to go on)",
                peak,
                result.stopped_at_epoch,
                config.loop.train_epochs,
            )
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

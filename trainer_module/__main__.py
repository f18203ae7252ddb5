"""python -m trainer_module: train, evaluate in the loop and export one EfficientNet run; search
hyperparameters; draw a run's report.

    python -m trainer_module [train] --preset P | --config FILE ...   one run (the bare form is ``train``)
    python -m trainer_module tune --preset P ...                      a hyperparameter search
    python -m trainer_module report MODEL_DIR                         a run's report.html

--plan trains nothing: it prints the resolved config, what it resolves to and the learning rate at --lr-steps.
A run writes MODEL_DIR/export/ (the SavedModel), metrics.json, report.html, run_log.jsonl, config.json,
TensorBoard summaries and checkpoints; the same MODEL_DIR resumes from the last checkpoint. The libraries'
logs go to MODEL_DIR/logs/trainer-<time>.log (--verbose: live on stderr). Guide: docs/training.md.

Exit status: 0 done, 2 a bad flag, setting or input, 130 Ctrl-C (a run keeps its last checkpoint and the same
command resumes it; a search keeps its finished trials and the same command goes on).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)

from trainer_module import lean_imports  # noqa: E402

if __name__ == "__main__" and lean_imports.wanted(sys.argv[1:]):
    # Run as the program (never when imported by a library or a test): before TensorFlow is imported, refuse
    # the optional packages Keras would import and a run never uses (why: trainer_module.lean_imports).
    lean_imports.install()

# TensorFlow (imported by the presets) prints on import: it is imported inside the console session.
from effnet_common import console, goodput, stopping  # noqa: E402

stopping.die_with_parent()  # a search's trial ends with its search (a no-op for any other start)

LOG_DIR = "logs"


COMMANDS = ("train", "tune", "report")


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``train`` (also the bare form), ``tune`` and ``report`` as subcommands."""
    from trainer_module import presets

    epilog = __doc__.split("\n\n", 2)[2] + "\npresets: " + ", ".join(presets.preset_names())
    formatter = argparse.RawDescriptionHelpFormatter
    parser = console.ArgumentParser(
        prog="python -m trainer_module",
        description=__doc__.split("\n\n")[0],
        epilog=epilog,
        formatter_class=formatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="{train,tune,report}")
    train = commands.add_parser(
        "train", help="one training run (the bare form)", epilog=epilog, formatter_class=formatter
    )
    add_train_arguments(train)
    add_tune_arguments(commands.add_parser("tune", help="a hyperparameter search, each trial a run"))
    report = commands.add_parser("report", help="draw report.html and its plots from a model directory")
    report.add_argument("model_dir", help="the run's model directory (local, gs://, ...)")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command's arguments; without a subcommand (``python -m trainer_module --preset ...``) it is
    ``train``, as the command was before it had others."""
    parser = build_parser()
    if not argv[:1] or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["train", *argv]
    args = parser.parse_args(argv)
    args.parser = parser._subparsers._group_actions[0].choices[args.command]
    return args


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help="named config (see the list below)")
    source.add_argument(
        "--config", metavar="FILE",
        help="a run resolved before: a run's config.json or the file a search hands its trials",
    )  # fmt: skip
    parser.add_argument("--train-files", action="append", help="glob of training shards")
    parser.add_argument("--eval-files", action="append", help="glob of validation shards")
    parser.add_argument("--model-dir", help="checkpoints, logs, metrics and the export")
    parser.add_argument(
        "--no-export", dest="export", action="store_false",
        help="train and evaluate only, no SavedModel (what a search does with its trials: their evaluations "
        "are the result, and the chosen values are trained again)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override a config field, e.g. --set loop.train_epochs=3 --set data.global_batch_size=128",
    )  # fmt: skip
    parser.add_argument(
        "--hyperparameters", metavar="JSON",
        help="a search's best_hyperparameters.json (python -m trainer_module tune): applied like --set, "
        "before the --set overrides; warmup and decay epochs scaled to this run's loop.train_epochs",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-devices", type=int, default=0, help="split the CPU into N logical devices (mirrored strategy)"
    )
    parser.add_argument(
        "--profile-steps", type=_step_range, metavar="FIRST-LAST",
        help="trace training steps FIRST to LAST with TensorFlow's profiler into the run's TensorBoard "
        "directory (loop.profile_from_step / loop.profile_steps); open it in TensorBoard's Profile tab",
    )  # fmt: skip
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


def _step_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` -> (first step, number of steps)."""
    first, dash, last = text.partition("-")
    try:
        first_step, last_step = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FIRST-LAST step numbers, e.g. 20-24, got {text!r}"
        ) from None
    if not dash or first_step < 0 or last_step < first_step:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST with 0 <= FIRST <= LAST, got {text!r}")
    return first_step, last_step - first_step + 1


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated step numbers, got {text!r}") from None
    if any(step < 0 for step in steps):
        raise argparse.ArgumentTypeError(f"steps must be >= 0, got {text!r}")
    return steps


def report_main(args) -> int:
    """``python -m trainer_module report MODEL_DIR``: redraws the run report of a finished or running run."""
    from trainer_module import report

    try:
        with stopping.describe("the report was not redrawn (its earlier files are as they were)"):
            print(report.write_report(args.model_dir))
    except ValueError as e:
        return console.fail(e)
    return 0


def _task_suffix() -> str:
    """'' for a single process or the chief; '-worker-1' for another task of a TF_CONFIG cluster (the tasks
    share the model directory, each keeps its own log)."""
    from trainer_module.distribute import strategies

    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if strategies.is_chief_task(tf_config):
        return ""
    return f"-{tf_config['task']['type']}-{tf_config['task']['index']}"


def _upload(local_path: str, path: str) -> None:
    from trainer_module import files

    with open(local_path, encoding="utf-8", errors="backslashreplace") as f:
        files.write_text(path, f.read())


def base_config(args):
    """The config the run starts from: ``--preset``'s, or the resolved run of ``--config`` (its search's
    values stay recorded as such). Raises console.UsageError naming the flag.

    A preset loads no TensorFlow (a misspelt one is refused at once); reading ``--config`` takes gfile."""
    from trainer_module import presets, resolve

    if args.preset:
        try:
            return resolve.ResolvedRun(presets.get_preset(args.preset))
        except ValueError as e:
            raise console.UsageError("--preset", args.preset, console.one_line(e)) from None
    from trainer_module import files

    try:
        return resolve.ResolvedRun.from_json(files.read_text(args.config))
    except (files.Error, TypeError, ValueError) as e:
        raise console.UsageError(
            "--config", args.config, console.one_line(getattr(e, "message", e))
        ) from None


def resolved_run(args, data=None, base=None):
    """The run of these arguments (``trainer_module.resolve``): the base config (``base``, read when None),
    ``--hyperparameters``, the ``--set`` settings, then the shards' ``data`` sizes.

    Raises:
      console.UsageError: naming the override, or the hyperparameters file and its problem.
    """
    from trainer_module import resolve
    from trainer_module.config import parse_overrides

    base = base_config(args) if base is None else base
    try:
        settings = parse_overrides(args.overrides)
        if getattr(args, "profile_steps", None):
            first_step, num_steps = args.profile_steps
            settings.update({"loop.profile_from_step": first_step, "loop.profile_steps": num_steps})
        run = resolve.resolve_run(base.config, settings, data=data, tuned=base.tuned)
    except (TypeError, ValueError) as e:
        raise console.UsageError("", "", console.one_line(e)) from None  # the message names the override
    if not getattr(args, "hyperparameters", None):
        return run
    try:
        values = resolve.read_hyperparameters(args.hyperparameters)
        return resolve.resolve_run(base.config, settings, hyperparameters=values, data=data, tuned=base.tuned)
    except (TypeError, ValueError) as e:
        raise console.UsageError("--hyperparameters", args.hyperparameters, console.one_line(e)) from None


def check_settings(args):
    """What the shards cannot change, checked before they are looked at: the base config (``--preset``'s name,
    ``--config``'s file) and the ``--set`` strings (their form, keys and types). Looking at the shards loads
    TensorFlow (gfile), seconds before a misspelt name would be refused; the config's rules over the values
    (a batch against the epoch) still wait for the shards' sizes (``resolved_run``). Returns the base config.

    Raises:
      console.UsageError: naming the flag, or the override and its problem.
    """
    from trainer_module.config import parse_overrides

    base = base_config(args)
    try:
        parse_overrides(args.overrides)
    except (TypeError, ValueError) as e:
        raise console.UsageError("", "", console.one_line(e)) from None  # the message names the override
    return base


def check_data(train_files: list[str], eval_files: list[str]) -> None:
    """Each glob of ``--train-files`` / ``--eval-files`` matches a file whose first byte can be read."""
    from trainer_module import files

    for flag, patterns in (("--train-files", train_files), ("--eval-files", eval_files)):
        for pattern in patterns:
            try:
                matches = files.glob(pattern)
                if not matches:
                    raise console.UsageError(flag, pattern, "matches no file")
                files.read_first_byte(matches[0])
            except files.Error as e:
                raise console.UsageError(
                    flag, pattern, f"cannot read ({console.one_line(e.message)})"
                ) from None


def manifest_sizes(train_files: list[str], eval_files: list[str]):
    """The shards' sizes and classes where their manifests give them (nothing is read end to end), or None.

    The run takes its epoch from the shards' manifest whatever the preset says, so the config is checked
    against that epoch: batch 4096 of the demo preset on 60,000 sharded images is a valid run, though the
    demo's own data has 1,438. Shards without a manifest are counted by the run.

    Raises:
      console.UsageError: a manifest that does not describe the files beside it, naming the flags.
    """
    from trainer_module import resolve

    try:
        return resolve.data_sizes(train_files, eval_files, manifests_only=True)
    except ValueError as e:
        flags = "--train-files/--eval-files"
        raise console.UsageError(flags, ",".join(train_files + eval_files), console.one_line(e)) from None


def make_directory(flag: str, path: str) -> None:
    """Creates the output directory ``path`` (last, so that a failed check before leaves nothing behind)."""
    from trainer_module import files

    try:
        files.make_directory(path)
    except NotADirectoryError:
        raise console.UsageError(flag, path, "is not a directory") from None
    except files.Error as e:
        raise console.UsageError(flag, path, f"cannot create it ({e.message})") from None


def preflight(args):
    """The settings the data cannot change (``check_settings``, before anything loads TensorFlow), the data
    (each glob matches a readable file), the config against the data, the model directory (created last, so
    that a failed check leaves nothing behind); every path through ``trainer_module.files`` (local, gs://,
    ram://). Returns the resolved run.

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    if args.plan:
        return resolved_run(args)
    if args.lr_steps:
        args.parser.error("--lr-steps goes with --plan")
    missing = [flag for flag in ("train_files", "eval_files", "model_dir") if not getattr(args, flag)]
    if missing:
        resolved_run(args)  # a wrong setting first, if any
        args.parser.error("a training run needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    base = check_settings(args)
    check_data(args.train_files, args.eval_files)
    run = resolved_run(args, manifest_sizes(args.train_files, args.eval_files), base)
    make_directory("--model-dir", args.model_dir)
    return run


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    from trainer_module.choices import SEARCHES  # the names only: building the parser loads no TensorFlow

    parser.description = (
        "Searches hyperparameters; each trial is a run of python -m trainer_module train --config, handed "
        "its resolved run as a file (its in-loop top-1 the objective). Run again in the same --tune-dir to "
        "resume: finished trials are kept."
    )
    parser.add_argument("--preset", required=True, help="named config the trials start from")
    parser.add_argument("--train-files", action="append", required=True, help="glob of training shards")
    parser.add_argument(
        "--eval-files", action="append", required=True, help="glob of the shards trials evaluate on"
    )
    parser.add_argument("--tune-dir", required=True, help="the search's state, trials and results")
    parser.add_argument("--search", default="hyperband", help=f"one of {', '.join(SEARCHES.names())}")
    parser.add_argument(
        "--max-epochs", type=int,
        help="every trial's schedule (loop.train_epochs) and Hyperband's longest trial "
        "(default: the config's)",
    )  # fmt: skip
    parser.add_argument(
        "--max-trials", type=int, default=10, help="trials of the bayesian and random searches"
    )
    parser.add_argument("--factor", type=int, default=3, help="Hyperband's reduction factor")
    parser.add_argument("--iterations", type=int, default=1, help="times Hyperband runs its brackets")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (trials train with loop.seed)")
    parser.add_argument(
        "--space", action="append", default=[], metavar="KEY=KIND:LOW:HIGH",
        help="tune KEY (kinds log, linear, int; or KEY=choice:A,B), replacing or adding to the default "
        "space",
    )  # fmt: skip
    parser.add_argument(
        "--only",
        action="store_true",
        help="tune the --space dimensions only, not the default space beside them",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override a config field of the run the trials start from, "
        "e.g. --set data.global_batch_size=128",
    )  # fmt: skip
    parser.add_argument("--cpu-devices", type=int, default=0, help="logical CPU devices of each trial")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' logs live")


def tune_preflight(args):
    """The settings the data cannot change and the search's name (before KerasTuner and TensorFlow load), the
    data, the search (the resolved run its trials start from, the space, the budget), then the directory
    (created and claimed last).

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    from trainer_module.choices import SEARCHES

    base = check_settings(args)
    try:
        SEARCHES.check(args.search)
    except ValueError as e:
        raise console.UsageError("", "", console.one_line(e)) from None  # the message names --search
    from trainer_module import tuning  # KerasTuner, and TensorFlow with it: after the checks above

    check_data(args.train_files, args.eval_files)
    run = resolved_run(args, manifest_sizes(args.train_files, args.eval_files), base)
    try:
        changes = tuple(tuning.Dimension.parse(text) for text in args.space)
    except ValueError as e:
        raise console.UsageError("--space", "", console.one_line(e)) from None
    search = tuning.Search(
        config=run.config,
        train_files=tuple(args.train_files),
        eval_files=tuple(args.eval_files),
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


def tune_main(args, session) -> int:
    """``python -m trainer_module tune``: one line per trial, then the best values and where they are."""
    try:
        search = tune_preflight(args)
    except console.UsageError as e:
        return console.fail(e)
    from trainer_module import files, tuning

    session.keep_log(files.join(args.tune_dir, LOG_DIR, console.log_name("tune")), _upload)
    tuner = tuning.build_tuner(search, args.tune_dir)
    console.say(tuning.planned_budget_line(search))
    stopped = (
        f"the finished trials are kept in {args.tune_dir} and the running one keeps its checkpoints; run the "
        "same command again to go on with the search"
    )
    try:
        with stopping.describe(stopped):
            tuner.search()
    except RuntimeError as e:  # KerasTuner ends a search after consecutive failed trials
        return console.fail(e, status=1)
    best = tuning.write_summaries(tuner)
    if best is None:
        return console.fail("no trial completed; see " + files.join(args.tune_dir, tuning.TRIALS_FILE), 1)
    console.say("best top-1 %.4f (trial %s): %s", best["top1"], best["trial_id"], tuning.values_text(best))
    console.say("wrote %s", files.join(args.tune_dir, tuning.BEST_HYPERPARAMETERS_FILE))
    return 0


def train_main(args, session) -> int:
    """``python -m trainer_module [train]``: one line per evaluation, then the peak and the export."""
    try:
        run = preflight(args)
    except console.UsageError as e:
        return console.fail(e)
    config = run.config
    if args.plan:
        from trainer_module.dry_run import plan_report

        print(json.dumps(plan_report(config, args.lr_steps), indent=2))
        return 0
    from trainer_module import files, recorder, train
    from trainer_module import run as runs
    from trainer_module.data import input_pipeline

    session.keep_log(
        files.join(args.model_dir, LOG_DIR, console.log_name("trainer" + _task_suffix())), _upload
    )
    devices = runs.use_logical_cpus(args.cpu_devices) if args.cpu_devices else None
    paths = train.RunPaths(args.model_dir, exports=args.export)

    def stopped() -> str:
        step = train.last_checkpoint_step(paths.checkpoint_dir)
        if step is None:
            return "no checkpoint yet (the first comes with the first evaluation); run the same command again"
        return (
            f"the checkpoint of step {step} is kept in {paths.checkpoint_dir}; run the same command again to "
            "resume from it"
        )

    try:
        with stopping.describe(stopped):
            started = goodput.process_started(os.getpid())  # the command's imports count as its time
            result = runs.run(run, args.train_files, args.eval_files, paths, devices, started=started)
    except (input_pipeline.LabelError, train.NonFiniteLossError, ValueError) as e:
        return console.fail(e)
    peak = "none" if result.peak_top1 is None else f"{result.peak_top1:.4f} at step {result.peak_step}"
    if result.stopped_at_epoch is None and result.export_dir:
        console.say("peak top-1 %s; exported to %s", peak, result.export_dir)
    elif result.stopped_at_epoch is None:
        console.say("peak top-1 %s; not exported (--no-export)", peak)
    else:
        console.say(
            "peak top-1 %s; stopped at epoch %d of %d (run again with a later loop.stop_at_epoch to go on)",
            peak,
            result.stopped_at_epoch,
            config.loop.train_epochs,
        )
    account = recorder.read_time_account(args.model_dir, recorder.TRAINING_ACCOUNT)
    if account is not None and not _task_suffix():  # the chief's (a failed account was logged)
        console.say("%s", account.one_line())
    print(json.dumps(result.summary()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with console.session(verbose=console.wants_verbose(argv)) as session:
        args = parse_args(argv)
        # report keeps no log file: it prints the report's path and nothing else (what the libraries print
        # while drawing goes to the session's temporary log, removed at the end).
        return {"train": train_main, "tune": tune_main, "report": lambda args, _: report_main(args)}[
            args.command
        ](args, session)


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())

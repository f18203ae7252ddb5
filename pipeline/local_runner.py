"""python -m pipeline.local_runner: the whole pipeline on this machine with the TFX LocalDagRunner.

Runs on the embedded data (scikit-learn's real digits laid out as the ILSVRC2012 archives) unless a training
and a validation input are given (the pipeline trains on one and gates on the other). Metadata goes to a
SQLite store under the pipeline root, so a second run reuses the cached steps (an unchanged model is neither
evaluated nor pushed again). It ends by printing the Evaluator's top-1, the verdict and where the model was
pushed, and exits 0 when a model was pushed, 3 when it missed the target, 2 with one ``error:`` line for a
wrong flag or a known failure, 130 on Ctrl-C. Every run that got as far as the pipeline, failed and stopped
ones too, adds a row to PIPELINE_ROOT/runs/index.html (``pipeline.runs_page``).

The console shows each step, one line per training evaluation and the verdict; the libraries' logs go to
PIPELINE_ROOT/logs/local_runner-<time>.log (``--verbose``: live on stderr). After Ctrl-C the same command goes
on from the finished steps, the training from its checkpoints in PIPELINE_ROOT/checkpoints/.
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

from effnet_common import console, goodput, path_checks, stopping  # noqa: E402
from pipeline import tune_flags  # noqa: E402

NOT_BLESSED_EXIT = console.MISSED_TARGET_EXIT
# A trial's schedule when tuning on this machine: a few epochs, so that the demo's search takes minutes.
TUNE_MAX_EPOCHS = 6
LOG_DIR = "logs"
EMBEDDED_DIR = "embedded_data"
# Under the pipeline root, per pipeline: the Trainer's checkpoints (by settings and data) and the Tuner's
# trials, which outlive a stopped run so that the next one resumes them.
CHECKPOINTS_DIR = "checkpoints"
TUNING_DIR = "tuning"
# The trainer-tpu image a rehearsed slice's worker 0 runs: what scripts/images.sh builds.
REHEARSAL_IMAGE = "effnet/trainer-tpu:local"
SETUP_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")


def build_parser() -> argparse.ArgumentParser:
    from trainer_module.presets import preset_names  # the pipeline presets' names, without loading TensorFlow

    names = sorted(preset_names())
    parser = console.ArgumentParser(
        prog="python -m pipeline.local_runner", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--pipeline-root",
        default="outputs/pipeline",
        help="artifacts, metadata, checkpoints and pushed models",
    )
    parser.add_argument(
        "--preset",
        default="demo",
        choices=names,
        metavar="PRESET",
        help="what to train and how to shard (default %(default)s: the embedded digits' tiny EfficientNet; "
        "smoke: one epoch, target 0; or a row of the paper's Table 2); one of: " + ", ".join(names),
    )
    parser.add_argument(
        "--target-top1",
        type=float,
        default=None,
        help="override the preset's target top-1: the trainer stops once it is reached and the Evaluator "
        "blesses only a model that reaches it (the same as --param target_top1 on Vertex)",
    )
    inputs = parser.add_argument_group(
        "inputs (default: the embedded digits; otherwise a training and a validation input)"
    )
    inputs.add_argument(
        "--train-archive", default="", help="ILSVRC2012_img_train.tar (one <wnid>.tar per synset)"
    )
    inputs.add_argument("--val-archive", default="", help="ILSVRC2012_img_val.tar (flat, official labels)")
    inputs.add_argument("--train-dir", default="", help="extracted training set: DIR/<wnid>/*.JPEG")
    inputs.add_argument("--val-dir", default="", help="validation: DIR/<wnid>/*.JPEG or flat official names")
    parser.add_argument(
        "--max-failures", type=int, default=0, help="unusable inputs tolerated while sharding (default 0)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="trainer config override, e.g. --set loop.train_epochs=10",
    )
    parser.add_argument(
        "--beam-workers",
        type=int,
        default=2,
        help="DirectRunner worker threads of the sharding and evaluation steps (default %(default)s)",
    )
    tune_flags.add_tune_flags(
        parser,
        "tuning (a Tuner step before the Trainer, which trains with its best values)",
        max_epochs=TUNE_MAX_EPOCHS,
        max_epochs_help="the schedule of every trial, in epochs (default %(default)s)",
        max_trials=6,
    )
    rehearsal = parser.add_argument_group(
        "rehearsing a TPU pod run (the Trainer on a multi-host slice, here: pipeline/tpu_rehearsal.py)"
    )
    rehearsal.add_argument(
        "--rehearse-slice",
        default="",
        metavar="ACCELERATOR",
        help="train through the TPU VM backend on a rehearsed slice of this type (e.g. tpu-v4-32): a Cloud "
        "TPU API on 127.0.0.1 whose hosts are local processes; worker 0 trains in the trainer image with "
        "Docker (logical CPUs standing in for the TPU), and the slice is deleted at the end",
    )
    rehearsal.add_argument(
        "--rehearse-image",
        default=REHEARSAL_IMAGE,
        metavar="IMAGE",
        help="with --rehearse-slice: the trainer-tpu image worker 0 runs (default %(default)s, what "
        "scripts/images.sh build trainer-tpu makes)",
    )
    rehearsal.add_argument(
        "--rehearse-preempt-at-step",
        type=int,
        default=0,
        metavar="STEP",
        help="with --rehearse-slice: the service preempts the slice once the trainer logged this step (the "
        "step creates it again and the trainer resumes from its checkpoint)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' logs live instead of writing them to a file",
    )
    return parser


def embedded_archives(root: str) -> tuple[str, str]:
    """Where the embedded digits sit as ILSVRC2012-style archives under ``root`` (see ``write_embedded``)."""
    from beam_preprocess import sample_data

    return os.path.join(root, sample_data.TRAIN_ARCHIVE), os.path.join(root, sample_data.VAL_ARCHIVE)


def write_embedded(root: str) -> None:
    """Writes the embedded archives under ``root`` once (they are deterministic)."""
    from beam_preprocess import sample_data

    if not all(os.path.exists(path) for path in embedded_archives(root)):
        sample_data.write_digits_archives(root)


def known_errors() -> tuple[type[BaseException], ...]:
    """Failures a person fixes from one line (the log file holds the rest): bad inputs and budgets, a
    rehearsed slice that failed. Their modules load Beam and TensorFlow: imported when a run fails, never for
    a refused flag (``main``)."""
    from beam_preprocess.run import FailureBudgetExceeded, OutputExistsError
    from components.tpu_vm import SliceFailed
    from trainer_module.data.input_pipeline import LabelError
    from trainer_module.train import NonFiniteLossError

    return (
        console.UsageError, FailureBudgetExceeded, OutputExistsError, LabelError, NonFiniteLossError,
        SliceFailed,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with console.session(verbose=console.wants_verbose(argv)) as session:
        args = build_parser().parse_args(argv)
        try:
            return run(args, session)
        except console.UsageError as e:  # a refused flag: one line, without loading what known_errors names
            return console.fail(e)
        except Exception as e:
            if isinstance(e, known_errors()):
                return console.fail(e)
            raise


def preflight(args, preset):
    """Everything checked before any work: the run (settings, target, inputs: ``PipelinePreset.resolve``, as
    the cloud runner resolves it, both splits given), the inputs' files, the pipeline root (created last, so
    that a failed check leaves nothing behind). Returns the resolved pipeline run.

    The ``--set`` strings are parsed first: checking the inputs' files loads Beam (its FileSystems), and the
    embedded data's names numpy, seconds that a misspelt setting should not wait for. A search's name is
    checked before KerasTuner (and TensorFlow with it) checks the rest of the search.

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    from effnet_common import storage
    from trainer_module.config import parse_overrides
    from trainer_module.resolve import UNSET

    if args.beam_workers < 1:
        raise console.UsageError("--beam-workers", args.beam_workers, "must be at least 1")
    if args.max_failures < 0:
        raise console.UsageError("--max-failures", args.max_failures, "must be at least 0")
    if args.rehearse_slice:
        from components import tpu_slices

        if args.rehearse_slice not in tpu_slices.SLICES:
            raise console.UsageError(
                "--rehearse-slice", args.rehearse_slice,
                "is not a multi-host TPU slice; one of " + ", ".join(tpu_slices.SLICES),
            )  # fmt: skip
        if args.tune:
            raise console.UsageError(
                "--rehearse-slice", args.rehearse_slice, "rehearses the Trainer: leave out --tune"
            )
        from pipeline import tpu_rehearsal

        missing = tpu_rehearsal.missing_image(args.rehearse_image)
        if missing:
            raise console.UsageError("--rehearse-image", args.rehearse_image, missing)
    if args.rehearse_preempt_at_step and not args.rehearse_slice:
        raise console.UsageError(
            "--rehearse-preempt-at-step", args.rehearse_preempt_at_step, "goes with --rehearse-slice"
        )
    target = UNSET if args.target_top1 is None else args.target_top1
    try:
        changes = parse_overrides(args.overrides)
    except (TypeError, ValueError) as e:
        raise _setting_error(e, args) from None
    inputs = {"train_archive": args.train_archive, "val_archive": args.val_archive}
    inputs.update(train_dir=args.train_dir, val_dir=args.val_dir)
    for name, path in inputs.items():
        if path:
            check = path_checks.check_directory if name.endswith("_dir") else path_checks.check_file
            check("--" + name.replace("_", "-"), path)
    if not any(inputs.values()):
        root = os.path.abspath(args.pipeline_root)
        inputs["train_archive"], inputs["val_archive"] = embedded_archives(os.path.join(root, EMBEDDED_DIR))
    try:
        resolved = preset.resolve(changes, target_top1=target, inputs=inputs, max_failures=args.max_failures)
    except (TypeError, ValueError) as e:
        raise _setting_error(e, args) from None
    tuning = tune_flags.tuning_settings(args)
    if tuning is not None:
        from trainer_module.choices import SEARCHES

        try:
            SEARCHES.check(tuning["search"])  # a misspelt name before KerasTuner loads TensorFlow
            from trainer_module import tuning as tuning_module

            tuning_module.search_of_config(resolved.trainer_config, ("<shards>",), ("<shards>",), **tuning)
        except (TypeError, ValueError) as e:
            raise console.UsageError("", "", "--tune: " + console.one_line(e)) from None
    if not storage.is_local(args.pipeline_root):
        raise console.UsageError(
            "--pipeline-root", args.pipeline_root, "must be a local directory (its metadata store is SQLite)"
        )
    path_checks.make_writable_directory("--pipeline-root", os.path.abspath(args.pipeline_root))
    return resolved


def _setting_error(error: Exception, args) -> console.UsageError:
    """The refusal of a setting: one line naming it (an input as the flag that gives it)."""
    from beam_preprocess.config import with_flag_names

    flag = "--target-top1" if "target_top1" in str(error) and args.target_top1 is not None else ""
    return console.UsageError(flag, "", with_flag_names(console.one_line(error)))


def run(args, session: console.Session) -> int:
    """The pipeline on this machine; returns the exit status."""
    from pipeline import presets

    preset = presets.get(args.preset)
    resolved = preflight(args, preset)
    target = resolved.target_top1  # the run's one target: the trainer's stop and the gate
    root = os.path.abspath(args.pipeline_root)
    session.keep_log(os.path.join(root, LOG_DIR, console.log_name("local_runner")))
    from components import tfx_api as tfx
    from pipeline import local_steps, outcome, pipeline_def, run_account, runs_page
    from trainer_module import tfx_trainer

    if not (args.train_archive or args.val_archive or args.train_dir or args.val_dir):
        write_embedded(os.path.join(root, EMBEDDED_DIR))
        console.say(
            "data: the embedded digits as ILSVRC2012 archives in %s", os.path.join(root, EMBEDDED_DIR)
        )
    name = preset.pipeline_name
    console.say("pipeline %s: preset %s, target top-1 %.4f, root %s", name, preset.name, target, root)
    serving_dir = os.path.join(root, "serving_model", name)  # each pipeline (preset) pushes apart
    checkpoints = os.path.join(root, CHECKPOINTS_DIR, name)
    metadata_path = os.path.join(root, "metadata.sqlite")
    beam_args = [f"--direct_num_workers={args.beam_workers}", "--direct_running_mode=multi_threading"]
    if os.path.exists(SETUP_FILE):
        # Without a setup file, TFX's Beam executor packages TFX itself (a 50 MB sdist) on every run.
        beam_args.append(f"--setup_file={SETUP_FILE}")
    search = tune_flags.tuning_settings(args)
    tuning_dir = os.path.join(root, TUNING_DIR, name)
    artifacts = os.path.join(root, "artifacts")
    trainer = pipeline_def.TrainerStep(custom_config={tfx_trainer.CHECKPOINT_ROOT_KEY: checkpoints})
    rehearsal = None
    if args.rehearse_slice:
        from pipeline import tpu_rehearsal

        rehearsal = tpu_rehearsal.Rehearsal.start(
            args.rehearse_slice,
            root,
            tpu_rehearsal.Scenario(preempt_at_step=args.rehearse_preempt_at_step),
            args.rehearse_image,
        )
        trainer = rehearsal.trainer_step(name, checkpoints)
        console.say("rehearsing %s: the Cloud TPU API at %s", rehearsal.describe(), rehearsal.endpoint)
    pipeline = pipeline_def.create_pipeline(
        pipeline_def.PipelineSettings(
            name=name,
            root=artifacts,
            sharding=resolved.sharding,
            trainer_config=resolved.trainer_config,
            serving_model_dir=serving_dir,
            metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
                metadata_path
            ),
            beam_pipeline_args=tuple(beam_args),
            # A stopped training resumes from its checkpoints, kept by settings and data outside the run.
            trainer=trainer,
            tuning=pipeline_def.TuningStep({**search, "directory": tuning_dir})
            if search is not None
            else None,
            baseline_other_than_candidate=True,
        )
    )
    record = run_account.CommandRecord(root, name)  # where this command's time went
    steps = local_steps.StepLines(
        len(pipeline.components), artifacts, checkpoints, tuning_dir, serving_dir, record
    )
    logging.getLogger().addHandler(steps)
    row = runs_page.Row(preset.name, target)  # a failed or stopped run adds its row too

    def stopped() -> None:
        steps.record_running()
        record.close(run_account.STOPPED)

    try:
        with (
            runs_page.unfinished(root, row),
            stopping.describe(steps.stop_description),
            stopping.cleanup(steps.remove_unfinished),
            stopping.cleanup(stopped),
        ):
            tfx.orchestration.LocalDagRunner().run(pipeline)
    except BaseException:
        steps.record_running()
        record.close(run_account.FAILED)
        raise
    finally:
        logging.getLogger().removeHandler(steps)
        if rehearsal is not None:
            rehearsal.close()
    if rehearsal is not None:
        console.say("%s", rehearsal.summary())
    result = outcome.read_outcome(metadata_path, name, target)
    pushed_before = local_steps.PUSHER in steps.cached
    for line in result.report(pushed_before=pushed_before).splitlines():
        console.say("%s", line)
    account = _account(root, name, record, result.model_run_uri)
    report_path = tensorboard = None
    if result.model_run_uri:
        from trainer_module import report

        report_path = report.add_pipeline_lines(result.model_run_uri, result.report_lines())
        tensorboard = console.tensorboard_command(os.path.join(result.model_run_uri, "tensorboard"))
        console.say("run report: %s", report_path)
        console.say("TensorBoard: %s", tensorboard)
    row = runs_page.finished(row, result, report_path, tensorboard, pushed_before, account)
    if account is not None:
        console.say("%s", account.one_line())
    console.say("runs of this root: %s", runs_page.add(root, row))
    print(json.dumps(result.as_dict()))
    return 0 if result.pushed else NOT_BLESSED_EXIT


def _account(root: str, name: str, record, model_run_uri: str | None) -> goodput.TimeAccount | None:
    """This run's time account, which ends now (the command's record closed): its commands' parts, and
    when its Trainer trained in one of them (not a cached one's, an earlier run's), the training's parts and
    a slice's, the account then going into that run's metrics.json. None if it could not be made (logged)."""
    from components import tpu_vm
    from pipeline import run_account
    from trainer_module import recorder

    command = record.close(run_account.FINISHED)
    with goodput.best_effort("the run's time account"):
        commands = run_account.run_commands(root, name) or [command]
        trained = bool(model_run_uri) and run_account.trained(commands)
        training = recorder.read_time_account(model_run_uri, recorder.TRAINING_ACCOUNT) if trained else None
        slices = tpu_vm.time_spans(model_run_uri, training) if training is not None else []
        account = run_account.account(commands, training, slices)
        if training is not None:
            recorder.add_time_account(model_run_uri, recorder.RUN_ACCOUNT, account)
        return account
    return None


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())

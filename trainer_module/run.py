"""One training run, end to end: the run against its shards -> strategy -> train and evaluate -> export.

The one entry point of the CLI (``python -m trainer_module``) and the TFX Trainer's ``run_fn``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time

import tensorflow as tf

from effnet_common import goodput
from trainer_module import export, goodput_log, recorder, report, resolve, train
from trainer_module.data import input_pipeline
from trainer_module.distribute import strategies
from trainer_module.goodput_log import GoodputLog
from trainer_module.recorder import RunResult
from trainer_module.resolve import ResolvedRun

logger = logging.getLogger("trainer_module")


def use_logical_cpus(count: int) -> list[str]:
    """Splits the CPU into ``count`` logical devices (MirroredStrategy on one machine without GPUs)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def size_thread_pools(threads: int) -> None:
    """TensorFlow's op thread pools (intra-op and inter-op) sized for ``threads`` cores (``loop.cpu_threads``;
    0 leaves them as they are).

    The pools can only be sized before TensorFlow's runtime starts in the process; where it has started with
    other sizes (a pipeline that ran TensorFlow before its Trainer, in one process) the run keeps them and
    says so in its log; the input pipelines' pools are sized by their options either way.
    """
    threading = tf.config.threading
    wanted = (threads, threads)
    if (
        not threads
        or (threading.get_intra_op_parallelism_threads(), threading.get_inter_op_parallelism_threads())
        == wanted
    ):
        return
    try:
        threading.set_intra_op_parallelism_threads(threads)
        threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        logger.warning(
            "loop.cpu_threads=%d: TensorFlow's runtime started before the run in this process, so its op "
            "thread pools keep their size; the input pipelines use %d threads",
            threads,
            threads,
        )


def run(
    resolved: ResolvedRun,
    train_files: list[str],
    eval_files: list[str],
    paths: train.RunPaths,
    devices: list[str] | None = None,
    started: float | None = None,
) -> RunResult:
    """Trains, evaluates in the loop, writes metrics.json, exports the SavedModel and writes the run report
    (``report.html`` beside metrics.json); returns the result.

    ``resolved`` is the run (``trainer_module.resolve``), resolved here once more against the shards it trains
    on: their manifests give the epoch, the evaluation size and the classes. The settings that came from a
    hyperparameter search (``resolved.tuned``) are listed as such in config.json and the report. A truncated
    run (``loop.stop_at_epoch``) exports nothing: its weights are not the end of their schedule; nor does a
    run whose paths say so (``RunPaths.exports``: a search's trial).

    The attempt's goodput record (``trainer_module.goodput_log``) starts at ``started`` (a command's process
    start: its imports count) or now, and the training's time account goes into metrics.json.
    """
    entered = time.time()
    logging.getLogger("trainer_module").setLevel(logging.INFO)
    resolved = resolved.with_data(resolve.data_sizes(train_files, eval_files))
    config = resolved.config
    timeline = GoodputLog(paths.checkpoint_dir, started or entered, entered)
    size_thread_pools(config.loop.cpu_threads)
    with timeline.timed("TPU_INITIALIZATION"):
        strategy = strategies.build_strategy(config, devices)
    timeline.chief = chief = train.is_chief(strategy)
    result, trainer = train.train_and_evaluate(
        config, train_files, eval_files, paths, strategy, tuned=dict(resolved.tuned), timeline=timeline
    )
    if result.stopped_at_epoch is None and paths.exports:
        with timeline.timed("EXPORT"):
            result = _export(config, trainer, result, train_files, paths, chief)
    if chief:
        with timeline.timed("REPORT"):
            path = report.write_report(paths.model_dir)
    timeline.job_ended()
    if chief:
        # The report's own time is part of the account; the account joins the report once known.
        with goodput.best_effort("the training's time account"):
            account = goodput_log.account(paths.checkpoint_dir)
            recorder.add_time_account(paths.model_dir, recorder.TRAINING_ACCOUNT, account)
            report.add_pipeline_lines(paths.model_dir, {})
        logger.info("report: %s", path)
    return result


def _export(config, trainer, result: RunResult, train_files, paths: train.RunPaths, chief: bool) -> RunResult:
    """Writes the SavedModel of the averaged weights, as evaluated; returns the result naming it."""
    plan = config.plan
    classes = input_pipeline.shard_classes(input_pipeline.list_files(train_files))  # the answers' names
    # Under MultiWorkerMirroredStrategy every worker takes part in saving; the chief's copy is kept.
    directory = paths.resolved_export_dir if chief else tempfile.mkdtemp(prefix="export-worker-")
    with trainer.evaluation_weights():
        export.export_saved_model(
            trainer.model,
            plan.input_size,
            directory,
            plan.eval_crop_padding_pixels,
            config.data.clip_resized,
            classes,
        )
    if not chief:
        shutil.rmtree(directory, ignore_errors=True)
    return dataclasses.replace(result, export_dir=paths.resolved_export_dir)

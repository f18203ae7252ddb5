"""One training run, end to end: data sizes -> strategy -> train and evaluate -> export.

The one entry point of the CLI (``python -m trainer_module``) and the TFX Trainer's ``run_fn``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile

import tensorflow as tf

from trainer_module import export, input_pipeline, report, strategies, train
from trainer_module.config import TrainerConfig, with_overrides
from trainer_module.recorder import RunResult

logger = logging.getLogger("trainer_module")


def use_logical_cpus(count: int) -> list[str]:
    """Splits the CPU into ``count`` logical devices (MirroredStrategy on one machine without GPUs)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def with_data_sizes(config: TrainerConfig, train_files, eval_files) -> TrainerConfig:
    """The config with the epoch and evaluation sizes and the class count of the real shards (their manifest's).

    A preset's epoch is then a pass over the data it trains on, whatever ``data.num_train_examples`` said, and
    its classifier has one output per class of the shards: 1,000 for ImageNet, 10 for shards of a 10-synset
    dataset sharded with ``--classes found`` (a 1,000-way head there would spread label smoothing over 990
    classes that never occur). Shards without a manifest keep ``model.num_classes``.
    """
    sizes = {
        "data.num_train_examples": input_pipeline.num_examples(train_files),
        "data.num_eval_examples": input_pipeline.num_examples(eval_files),
    }
    classes = input_pipeline.shard_classes(input_pipeline.list_files(train_files))
    if classes is not None:
        sizes["model.num_classes"] = len(classes)
    current = {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in sizes}
    changed = {k: v for k, v in sizes.items() if current[k] != v}
    if not changed:
        return config
    for key, value in changed.items():
        logger.info("%s=%d from the shards (the config said %d)", key, value, current[key])
    return with_overrides(config, [f"{k}={v}" for k, v in changed.items()])


def run(
    config: TrainerConfig,
    train_files: list[str],
    eval_files: list[str],
    paths: train.RunPaths,
    devices: list[str] | None = None,
    tuned: dict | None = None,
) -> RunResult:
    """Trains, evaluates in the loop, writes metrics.json, exports the SavedModel and writes the run report
    (``report.html`` beside metrics.json); returns the result.

    ``tuned`` holds the settings that came from a hyperparameter search (``trainer_module.tuning``), already
    applied to ``config``: config.json and the report list them as such. A truncated run
    (``loop.stop_at_epoch``) exports nothing: its weights are not the end of their schedule.
    """
    logging.getLogger("trainer_module").setLevel(logging.INFO)
    config = with_data_sizes(config, train_files, eval_files)
    strategy = strategies.build_strategy(config, devices)
    result, trainer = train.train_and_evaluate(config, train_files, eval_files, paths, strategy, tuned=tuned)
    plan = config.plan
    if result.stopped_at_epoch is not None:
        if train.is_chief(strategy):
            logger.info("report: %s", report.write_report(paths.model_dir))
        return result
    classes = input_pipeline.shard_classes(input_pipeline.list_files(train_files))  # the answers' names
    with trainer.evaluation_weights():  # export the averaged weights, as evaluated
        if train.is_chief(strategy):
            export.export_saved_model(
                trainer.model,
                plan.input_size,
                paths.resolved_export_dir,
                plan.eval_crop_padding_pixels,
                config.data.clip_resized,
                classes,
            )
        else:
            # Every worker takes part in saving under MultiWorkerMirroredStrategy; only the chief's copy is kept.
            scratch = tempfile.mkdtemp(prefix="export-worker-")
            export.export_saved_model(
                trainer.model,
                plan.input_size,
                scratch,
                plan.eval_crop_padding_pixels,
                config.data.clip_resized,
                classes,
            )
            shutil.rmtree(scratch, ignore_errors=True)
    if train.is_chief(strategy):
        logger.info("report: %s", report.write_report(paths.model_dir))
    return dataclasses.replace(result, export_dir=paths.resolved_export_dir)

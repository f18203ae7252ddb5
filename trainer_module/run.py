"""One training run, end to end: strategy -> train and evaluate -> export. Shared by the CLI and run_fn."""

from __future__ import annotations

import logging
import shutil
import tempfile

import tensorflow as tf

from trainer_module import export, strategies, train
from trainer_module.config import TrainerConfig


def use_logical_cpus(count: int) -> list[str]:
    """Splits the CPU into ``count`` logical devices (MirroredStrategy on one machine without GPUs)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def run(
    config: TrainerConfig,
    train_files: list[str],
    eval_files: list[str],
    paths: train.RunPaths,
    devices: list[str] | None = None,
) -> dict:
    """Trains, evaluates in the loop, writes metrics.json and exports the SavedModel; returns the metrics."""
    logging.getLogger("trainer_module").setLevel(logging.INFO)
    strategy = strategies.build_strategy(config, devices)
    metrics, trainer = train.train_and_evaluate(config, train_files, eval_files, paths, strategy)
    plan = config.plan
    with trainer.evaluation_weights():  # export the averaged weights, as evaluated
        if train.is_chief(strategy):
            export.export_saved_model(
                trainer.model, plan.input_size, paths.resolved_export_dir, plan.eval_crop_padding_pixels
            )
        else:
            # Every worker takes part in saving under MultiWorkerMirroredStrategy; only the chief's copy is kept.
            scratch = tempfile.mkdtemp(prefix="export-worker-")
            export.export_saved_model(trainer.model, plan.input_size, scratch, plan.eval_crop_padding_pixels)
            shutil.rmtree(scratch, ignore_errors=True)
    metrics["export_dir"] = paths.resolved_export_dir
    return metrics

"""The TFX Trainer's entry point: ``run_fn(fn_args)``, a short composition of the trainer's pieces.

The trainer config travels as JSON in ``custom_config['trainer_config']`` (``TrainerConfig.to_json()``).
The number of training examples per epoch is taken from the data the pipeline produced (the shard
manifest's record counts), so a preset's epoch means a pass over the real dataset.
"""

from __future__ import annotations

import logging
import os

from trainer_module import input_pipeline, run, train
from trainer_module.config import TrainerConfig, with_overrides

CONFIG_KEY = "trainer_config"

logger = logging.getLogger("trainer_module")


def config_from_fn_args(fn_args) -> TrainerConfig:
    """The trainer config of ``fn_args.custom_config``, with the epoch size of the real training data."""
    custom = fn_args.custom_config or {}
    if CONFIG_KEY not in custom:
        raise ValueError(
            f"the Trainer's custom_config has no '{CONFIG_KEY}' (keys: {sorted(custom)}); "
            "pass {'trainer_config': TrainerConfig.to_json()}"
        )
    config = TrainerConfig.from_json(custom[CONFIG_KEY])
    num_train = sum(input_pipeline.record_counts(input_pipeline.list_files(fn_args.train_files)))
    if num_train != config.data.num_train_examples:
        logger.info(
            "epoch size from the training data: %d examples (config said %d)",
            num_train,
            config.data.num_train_examples,
        )
        config = with_overrides(config, [f"data.num_train_examples={num_train}"])
    return config


def run_fn(fn_args) -> None:
    """TFX Trainer entry: trains with in-loop evaluation, writes TensorBoard summaries, checkpoints and
    metrics.json to ``fn_args.model_run_dir`` and the SavedModel to ``fn_args.serving_model_dir``."""
    config = config_from_fn_args(fn_args)
    paths = train.RunPaths(
        model_dir=fn_args.model_run_dir,
        tensorboard_dir=os.path.join(fn_args.model_run_dir, "tensorboard"),
        export_dir=fn_args.serving_model_dir,
    )
    metrics = run.run(config, list(fn_args.train_files), list(fn_args.eval_files), paths)
    logger.info(
        "trainer finished: peak top-1 %s, final top-1 %s", metrics["peak_top1"], metrics["final_top1"]
    )

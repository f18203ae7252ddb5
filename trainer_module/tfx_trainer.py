"""The TFX Trainer's entry point: ``run_fn(fn_args)``, a short composition of the trainer's pieces.

The trainer config travels as JSON in ``custom_config['trainer_config']`` (``TrainerConfig.to_json()``).
``trainer_module.run.run`` is the same entry point the CLI calls: it takes the epoch size from the shards'
manifest, so a preset's epoch means a pass over the real dataset.
"""

from __future__ import annotations

import logging

from trainer_module import files, run, train
from trainer_module.config import TrainerConfig

CONFIG_KEY = "trainer_config"

logger = logging.getLogger("trainer_module")


def config_from_fn_args(fn_args) -> TrainerConfig:
    """The trainer config of ``fn_args.custom_config``."""
    custom = fn_args.custom_config or {}
    if CONFIG_KEY not in custom:
        raise ValueError(
            f"the Trainer's custom_config has no '{CONFIG_KEY}' (keys: {sorted(custom)}); "
            "pass {'trainer_config': TrainerConfig.to_json()}"
        )
    return TrainerConfig.from_json(custom[CONFIG_KEY])


def run_fn(fn_args) -> None:
    """TFX Trainer entry: trains with in-loop evaluation, writes TensorBoard summaries, checkpoints and
    metrics.json to ``fn_args.model_run_dir`` and the SavedModel to ``fn_args.serving_model_dir``."""
    paths = train.RunPaths(
        model_dir=fn_args.model_run_dir,
        tensorboard_dir=files.join(fn_args.model_run_dir, "tensorboard"),
        export_dir=fn_args.serving_model_dir,
    )
    result = run.run(config_from_fn_args(fn_args), list(fn_args.train_files), list(fn_args.eval_files), paths)
    logger.info("trainer finished: peak top-1 %s, final top-1 %s", result.peak_top1, result.final_top1)

"""Hyperparameter tuning through the project's own training loop.

The paper tuned the learning rate and warmup for every batch size; a reproduction at another scale has to tune
too, every optimizer with the same budget. A search runs KerasTuner over a declared space of config settings,
each trial a run of ``python -m trainer_module train --config FILE`` handed its resolved run as a file:

- ``space``: the tuned settings (``Dimension``: key, kind, bounds), checked against the config.
- ``search``: ``Search`` (the start config, the space, the algorithm of ``SEARCHES``, the budget) and the
  directory a search claims.
- ``trials``: one trial as its own process, resumed from its checkpoints when killed.
- ``tuner``: ``TrainerTuner``, the ``keras_tuner.Tuner`` that runs them; ``build_tuner``.
- ``report``: ``trials.json``, ``best_hyperparameters.json`` and the console lines.

Use: ``build_tuner(search_of_config(config, train_files, eval_files), "runs/tune").search()``.
"""

from trainer_module.resolve import SCHEDULE_EPOCHS
from trainer_module.tuning.report import (
    BEST_HYPERPARAMETERS_FILE,
    TRIALS_FILE,
    planned_budget_line,
    trial_line,
    values_text,
    write_summaries,
)
from trainer_module.tuning.search import (
    OBJECTIVE,
    SEARCHES,
    Search,
    claim_directory,
    hyperband_budget,
    search_digest,
    search_of_config,
    with_space,
)
from trainer_module.tuning.space import Dimension, SearchSpace, check_space, default_space, space_with
from trainer_module.tuning.tuner import TrainerTuner, build_tuner

__all__ = [
    "BEST_HYPERPARAMETERS_FILE",
    "OBJECTIVE",
    "SCHEDULE_EPOCHS",
    "SEARCHES",
    "TRIALS_FILE",
    "Dimension",
    "Search",
    "SearchSpace",
    "TrainerTuner",
    "build_tuner",
    "check_space",
    "claim_directory",
    "default_space",
    "hyperband_budget",
    "planned_budget_line",
    "search_digest",
    "search_of_config",
    "space_with",
    "trial_line",
    "values_text",
    "with_space",
    "write_summaries",
]

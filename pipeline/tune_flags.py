"""The ``--tune`` flags of both runners (the local one and the cloud compiler) and the search settings they
give.

A module that only declares flags: no TensorFlow, no TFX.
"""

from __future__ import annotations

import argparse

from trainer_module.choices import SEARCHES


def add_tune_flags(
    parser: argparse.ArgumentParser, title: str, max_epochs: int, max_epochs_help: str, max_trials: int
):
    """Adds the group ``title`` of ``--tune``, ``--tune-search``, ``--tune-max-epochs`` (default
    ``max_epochs``) and ``--tune-max-trials`` (default ``max_trials``) to ``parser``; returns the group for a
    runner's own flags."""
    tune = parser.add_argument_group(title)
    tune.add_argument(
        "--tune", action="store_true", help="search hyperparameters before training (TFX Tuner + KerasTuner)"
    )
    tune.add_argument(
        "--tune-search",
        default="hyperband",
        help=f"one of {', '.join(SEARCHES.names())} (default %(default)s)",
    )
    tune.add_argument("--tune-max-epochs", type=int, default=max_epochs, help=max_epochs_help)
    tune.add_argument(
        "--tune-max-trials",
        type=int,
        default=max_trials,
        help="trials of a bayesian or random search (default %(default)s; Hyperband's follow from its "
        "epochs)",
    )
    return tune


def tuning_settings(args: argparse.Namespace) -> dict | None:
    """The Tuner's search settings of ``--tune`` (``trainer_module.tfx_trainer.TUNING_KEY``), or None."""
    if not args.tune:
        return None
    return {
        "search": args.tune_search,
        "max_epochs": args.tune_max_epochs,
        "max_trials": args.tune_max_trials,
    }

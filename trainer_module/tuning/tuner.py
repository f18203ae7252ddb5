"""The KerasTuner ``Tuner`` whose trials are runs of the trainer, used through KerasTuner's public interface.

``run_trial`` hands each trial its resolved run (``Search.trial_run``) and trains it as a process of its own
(``trials.train_trial``), then reports each in-loop evaluation's top-1 to the oracle at its epoch; the
objective is the peak top-1. Hyperband's ``tuner/epochs`` is the trial's ``loop.stop_at_epoch``, and a trial
that continues ``tuner/trial_id`` starts from a copy of that trial's checkpoints, so it resumes exactly. The
search keeps its state in its directory: built there again (``build_tuner``), KerasTuner reloads the finished
trials and the killed one runs again from its own checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import logging

import keras_tuner

from effnet_common import console
from trainer_module.tuning.report import trial_line, trial_summary, write_summaries
from trainer_module.tuning.search import OBJECTIVE, SEARCHES, Search, claim_directory
from trainer_module.tuning.trials import start_from, train_trial

PROJECT = "trials"  # KerasTuner's project directory under the search's directory: trial_<id>/ each


class TrainerTuner(keras_tuner.Tuner):
    """A KerasTuner tuner whose trials are runs of ``python -m trainer_module train --config``.

    Args:
      search: the checked search.
      oracle: the oracle ``SEARCHES`` built for it.
      directory: the search's directory (local or URL): ``trials/trial_<id>/`` per trial, the summaries.
      report: called with each finished trial's summary (``say_trial``: one line of the console's account).
    """

    def __init__(self, search: Search, oracle, directory: str, report=None):
        self.search_settings = search
        self.report = report
        # KerasTuner prints its reload notice; the account is ours (see ``report``).
        with contextlib.redirect_stdout(io.StringIO()):
            super().__init__(oracle=oracle, directory=directory, project_name=PROJECT)
        self.oracle.verbose = 0

    def search(self, *args, **kwargs):
        super().search(*args, **kwargs)
        if not self.holds_oracle:
            return
        # The chief of a parallel search serves the oracle and runs no trial itself: its summaries come here.
        write_summaries(self)
        # TFX's Tuner lists the oracle's best ``max_trials`` trials; Hyperband leaves it unset: all of them.
        if self.oracle.max_trials is None:
            self.oracle.max_trials = len(self.oracle.trials)

    # KerasTuner prints its summaries; the pipeline's console is ours: they go to the log.
    def search_space_summary(self, extended=False):
        with contextlib.redirect_stdout(io.StringIO()) as text:
            super().search_space_summary(extended)
        logging.getLogger("trainer_module").info("%s", text.getvalue())

    def results_summary(self, num_trials=10):
        with contextlib.redirect_stdout(io.StringIO()) as text:
            super().results_summary(num_trials)
        logging.getLogger("trainer_module").info("%s", text.getvalue())

    def run_trial(self, trial, *args, **kwargs):
        values = trial.hyperparameters.values
        try:
            run = self.search_settings.trial_run(values)
        except (TypeError, ValueError) as e:  # e.g. an end LR above this trial's peak: the search goes on
            raise keras_tuner.errors.FailedTrialError(console.one_line(e)) from None
        trial_dir = self.get_trial_dir(trial.trial_id)
        if values.get("tuner/trial_id"):
            start_from(self.get_trial_dir(values["tuner/trial_id"]), trial_dir)
        search = self.search_settings
        outcome = train_trial(run, trial_dir, search.train_files, search.eval_files, search.cpu_devices)
        if outcome.failed:
            error = outcome.attempt.error or f"the trainer exited {outcome.attempt.exit_code}"
            raise keras_tuner.errors.FailedTrialError(error)
        # A diverged run is a result, the worst one: what it evaluated before, or chance-free zero.
        evaluations = outcome.evaluations or [{"epoch": 0.0, OBJECTIVE: 0.0}]
        for evaluation in evaluations:
            self.oracle.update_trial(
                trial.trial_id, {OBJECTIVE: evaluation[OBJECTIVE]}, step=int(round(evaluation["epoch"]))
            )
        return {OBJECTIVE: max(e[OBJECTIVE] for e in evaluations)}

    @property
    def holds_oracle(self) -> bool:
        """Whether this process holds the search's oracle (not a worker of a parallel search, whose oracle is
        a client of the chief's)."""
        return isinstance(self.oracle, keras_tuner.Oracle)

    def on_trial_end(self, trial):
        super().on_trial_end(trial)  # the oracle scores and saves the trial
        trial = self.oracle.get_trial(trial.trial_id)
        summary = trial_summary(trial, self.get_trial_dir(trial.trial_id), self.search_settings.max_epochs)
        if self.holds_oracle:
            write_summaries(self)
        if self.report:
            self.report(summary)


def say_trial(summary: dict) -> None:
    """A finished trial's line on the console (the CLI's and the pipeline's Tuner step's account; a record of
    the log elsewhere, as on Vertex)."""
    console.say("%s", trial_line(summary))


def build_tuner(search: Search, directory: str, report=say_trial) -> TrainerTuner:
    """The tuner of a checked search in ``directory``: a new search, or the one the directory holds (its
    finished trials kept, a killed one resumed); ``report`` is called with each finished trial's summary.

    Raises:
      ValueError: the directory holds a different search.
    """
    claim_directory(search, directory)
    # KerasTuner takes 0 for "no seed" and draws one: the search's seed 0 is the oracle's 1.
    oracle = SEARCHES.build(search.search, search, search.hyperparameters(), search.seed + 1)
    return TrainerTuner(search, oracle, directory, report)

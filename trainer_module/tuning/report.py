"""A search's account: ``trials.json`` (the search and every trial), ``best_hyperparameters.json`` (the best
trial's values, read by ``train --hyperparameters`` and TFX's Trainer through ``resolve.search_values``) and
the console's lines (the planned budget, one line per trial).

A trial's summary: its values, the trial it continued, its epochs, top-1 history and best epoch, CPU and wall
seconds over its attempts, and its status ('completed', 'diverged', 'failed', ...).
"""

from __future__ import annotations

from keras_tuner.engine.trial import TrialStatus

from effnet_common import console
from trainer_module import files
from trainer_module.resolve import SCHEDULE_EPOCHS, SEARCHED_WITH_KEY, search_values, searched_with
from trainer_module.tuning.search import OBJECTIVE, Search
from trainer_module.tuning.trials import RUN_DIR, read_evaluations, read_record

BEST_HYPERPARAMETERS_FILE = "best_hyperparameters.json"
TRIALS_FILE = "trials.json"


def trial_summary(trial, trial_dir: str, max_epochs: int) -> dict:
    """One KerasTuner trial of a search of schedules of ``max_epochs``: its values, epochs, top-1 history, CPU
    seconds and status."""
    values = trial.hyperparameters.values
    record = read_record(trial_dir)
    history = [
        {"epoch": h["epoch"], "step": h.get("step"), OBJECTIVE: h[OBJECTIVE]}
        for h in read_evaluations(files.join(trial_dir, RUN_DIR))
    ]
    status = trial.status.lower()
    if status == "completed" and record.get("diverged"):
        status = "diverged"
    message = console.one_line(trial.message.strip().splitlines()[-1]) if trial.message else ""
    return {
        "trial_id": trial.trial_id,
        "status": status,
        "values": search_values(values),  # the settings: KerasTuner's and the search's bookkeeping dropped
        "continued_from": values.get("tuner/trial_id"),
        "initial_epoch": values.get("tuner/initial_epoch", 0),
        "epochs": values.get("tuner/epochs", max_epochs),
        "top1": trial.score,
        "best_epoch": trial.best_step if trial.score is not None else None,
        "history": history,
        "cpu_seconds": sum(a["cpu_seconds"] for a in record["attempts"]),
        "wall_seconds": sum(a["wall_seconds"] for a in record["attempts"]),
        "attempts": len(record["attempts"]),
        "message": message.partition(": ")[2] if message.startswith("keras_tuner") else message,
    }


def write_summaries(tuner) -> dict | None:
    """``trials.json`` and ``best_hyperparameters.json`` (the best completed trial's values with the search's
    schedule length) in the directory of ``tuner`` (a ``TrainerTuner``); returns the best trial's summary
    (None while no trial has completed)."""
    oracle, search = tuner.oracle, tuner.search_settings
    trials = [
        trial_summary(oracle.trials[i], tuner.get_trial_dir(i), search.max_epochs)
        for i in oracle.start_order
        if i in oracle.trials
    ]
    best = [t for t in oracle.get_best_trials(1) if t.status == TrialStatus.COMPLETED]
    summary = {"search": search.identity(), "best_trial": best[0].trial_id if best else None}
    files.write_json(files.join(tuner.directory, TRIALS_FILE), {**summary, "trials": trials})
    if not best:
        return None
    values = best[0].hyperparameters.values
    best_values = {
        **search_values(values),
        SCHEDULE_EPOCHS: values[SCHEDULE_EPOCHS],
        SEARCHED_WITH_KEY: searched_with(search.config),
    }
    files.write_json(files.join(tuner.directory, BEST_HYPERPARAMETERS_FILE), best_values)
    return next(t for t in trials if t["trial_id"] == best[0].trial_id)


def values_text(summary: dict) -> str:
    """A trial's values, short: 'lr_per_256=0.41 warmup_epochs=1.2 ...'."""
    return " ".join(f"{k.rpartition('.')[2]}={_short(v)}" for k, v in summary["values"].items())


def trial_line(summary: dict) -> str:
    """One line of the CLI's account of a trial."""
    values = values_text(summary)
    epochs = f"epochs {summary['initial_epoch']}-{summary['epochs']}"
    if summary["continued_from"]:
        epochs += f" (from trial {summary['continued_from']})"
    top1 = (
        "" if summary["top1"] is None else f"top-1 {summary['top1']:.4f} at epoch {summary['best_epoch']}  "
    )
    cpu = f"CPU {summary['cpu_seconds']:.0f}s"
    tail = f"  ({summary['message']})" if summary["message"] else ""
    return f"trial {summary['trial_id']} {summary['status']:<9} {top1}{epochs}  {cpu}  {values}{tail}"


def planned_budget_line(search: Search) -> str:
    """The search before it starts: its algorithm, schedule, space, and the trials and epochs it plans."""
    trials, epochs = search.planned_trials_and_epochs()
    how = (
        f"factor {search.factor}"
        if search.search == "hyperband"
        else console.plural(search.max_trials, "trial")
    )
    return (
        f"{search.search} search ({how}) of schedules of {console.plural(search.max_epochs, 'epoch')} over "
        f"{console.plural(len(search.space), 'setting')}: about {console.plural(trials, 'trial')}, "
        f"{console.plural(epochs, 'epoch')} of training"
    )


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
